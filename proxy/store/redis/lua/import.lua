-- ARGV[3] (the stamp) = created_at; ARGV[4] = replace (1/0); ARGV[5..11] = updated_at, next_seq,
-- llm_calls, boundary, summary_id ('' = none), summaries, turns; ARGV[12..17] = how many messages,
-- first-forwarded marks, rewrites, response ids, meta fields and inbox messages follow. Then (seq,
-- body, hash, status) per message, (seq, calls) per first-forwarded mark, (seq, content) per
-- rewrite, (id, JSON) per summary, (turn, JSON) per turn record, (meta field, value) per mark and
-- per field that describes the conversation (title, task, model, client, failures, last_error),
-- (response id, seq) per response id, (id, JSON, delivery or '', open 1/0) per inbox message,
-- then the request parts (below).
if redis.call('EXISTS', meta) == 1 then
  if ARGV[4] ~= '1' then return redis.error_reply('${CONVERSATION_EXISTS}') end
  local known = redis.call('SMEMBERS', resp)
  if #known > 0 then redis.call('HDEL', responses, unpack(known)) end
  redis.call('UNLINK', meta, body, hashes, statuses, live, fwd, rw, sums, turns, resp, inbox, idel, iopen, iat, chg)
  redis.call('ZREM', index, id)
  redis.call('ZREM', all, tenant .. '/' .. id)
  redis.call('ZREM', failed_index, id)
  redis.call('ZREM', failed_all, tenant .. '/' .. id)
end
ensure()
redis.call('HSET', meta, 'updated_at', ARGV[5], 'next_seq', ARGV[6], 'llm_calls', ARGV[7], 'boundary', ARGV[8],
           'summaries', ARGV[10], 'turns', ARGV[11])
if ARGV[9] ~= '' then redis.call('HSET', meta, 'summary_id', ARGV[9]) end
local i = 18
for _ = 1, tonumber(ARGV[12]) do
  local seq, h, status = ARGV[i], ARGV[i + 2], ARGV[i + 3]
  redis.call('HSET', body, seq, ARGV[i + 1])
  redis.call('HSET', hashes, seq, h)
  redis.call('HSET', statuses, seq, status)
  if status == '${LIVE}' then redis.call('ZADD', live, seq, seq .. ':' .. h) end
  i = i + 4
end
for _, part in ipairs({{fwd, ARGV[13]}, {rw, ARGV[14]}, {sums, ARGV[10]}, {turns, ARGV[11]}, {meta, ARGV[16]}}) do
  for _ = 1, tonumber(part[2]) do
    redis.call('HSET', part[1], ARGV[i], ARGV[i + 1])
    i = i + 2
  end
end
for _ = 1, tonumber(ARGV[15]) do
  redis.call('HSET', responses, ARGV[i], id .. '${RESPONSE_SEPARATOR}' .. ARGV[i + 1])
  redis.call('SADD', resp, ARGV[i])
  i = i + 2
end
if tonumber(redis.call('HGET', meta, 'failures') or '0') > 0 then
  local order = redis.call('HGET', meta, 'order')
  redis.call('ZADD', failed_index, order, id)
  redis.call('ZADD', failed_all, order, tenant .. '/' .. id)
end
for _ = 1, tonumber(ARGV[17]) do
  local mid, delivery = ARGV[i], ARGV[i + 2]
  redis.call('HSET', inbox, mid, ARGV[i + 1])
  if delivery ~= '' then
    redis.call('HSET', idel, mid, delivery)
    local seq = string.match(delivery, '^(%d+):')
    local ids = anchor_ids(seq)
    ids[#ids + 1] = mid
    redis.call('HSET', iat, seq, table.concat(ids, ','))
  end
  if ARGV[i + 3] == '1' then redis.call('SADD', iopen, mid) end
  i = i + 4
end
redis.call('HSET', meta, 'inbox', ARGV[17], 'inbox_open', redis.call('SCARD', iopen))
-- Then how many request parts, and (hash, row) per part, into the last KEY (rparts: not PRELUDE's).
local rparts = KEYS[#KEYS]
redis.call('DEL', rparts)
local nparts = tonumber(ARGV[i] or '0')
i = i + 1
for _ = 1, nparts do
  redis.call('HSET', rparts, ARGV[i], ARGV[i + 1])
  i = i + 2
end
commit()  -- a record of its own: version 1, a new incarnation
return 1
