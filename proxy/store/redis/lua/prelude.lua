local meta, body, hashes, statuses, live, fwd, rw, sums, turns, resp, pend, inbox, idel, iopen, iat, chg,
      index, tenants, created, all, responses, pending, failed_index, failed_all = unpack(KEYS)
local tenant, id, stamp = ARGV[1], ARGV[2], ARGV[3]

-- A write touches the seqs whose part of the record (Conversation: live, first-forwarded, rewritten,
-- inbox anchor) it changes, then commits: the record's version moves on and those seqs are logged
-- under it in chg, so a replica holding an older snapshot reads only what changed (RECORD).
local touched, touched_set = {}, {}
local function touch(seq)
  seq = tostring(seq)
  if not touched_set[seq] then
    touched_set[seq] = true
    touched[#touched + 1] = seq
  end
end

-- What every write of a turn moves, also one by a replica of a version that keeps no versions:
-- a record whose signature is not the one its latest commit left was written without a commit.
local function signature()
  local f = redis.call('HMGET', meta, 'next_seq', 'updated_at', 'turns', 'llm_calls')
  return (f[1] or '') .. ':' .. (f[2] or '') .. ':' .. (f[3] or '') .. ':' .. (f[4] or '')
end

local function commit()
  if redis.call('EXISTS', meta) == 0 then return end
  local version = redis.call('HINCRBY', meta, 'version', 1)
  if version == 1 then
    -- A new record (or one written before versions): an incarnation no earlier record of this key
    -- had (a delete or a Redis restart empty starts the version over), from the server's clock.
    local t = redis.call('TIME')
    redis.call('HSET', meta, 'incarnation', t[1] .. '.' .. t[2] .. '.' .. (redis.call('HGET', meta, 'order') or ''))
  end
  for _, seq in ipairs(touched) do redis.call('ZADD', chg, version, seq) end
  redis.call('HSET', meta, 'signed', signature())
end

-- Create the conversation record if new, and list it (creation order from a counter, not a clock).
local function ensure()
  if redis.call('EXISTS', meta) == 1 then return end
  local order = redis.call('INCR', created)
  redis.call('HSET', meta, 'created_at', stamp, 'updated_at', stamp, 'next_seq', 1, 'llm_calls', 0,
             'summaries', 0, 'turns', 0, 'boundary', 0, 'order', order)
  redis.call('ZADD', index, order, id)
  redis.call('ZADD', all, order, tenant .. '/' .. id)
  redis.call('SADD', tenants, tenant)
end

-- Status changes are ARGV[from..] (seq, status) pairs. A script checks them all before it writes
-- anything (Lua does not roll back), so a bad seq leaves everything as it was.
local function check_statuses(from)
  if from > #ARGV then return nil end
  if redis.call('EXISTS', meta) == 0 then return redis.error_reply('${NO_CONVERSATION}') end
  for i = from, #ARGV, 2 do
    if redis.call('HEXISTS', statuses, ARGV[i]) == 0 then
      return redis.error_reply('${NO_MESSAGE} ' .. ARGV[i])
    end
  end
  return nil
end

local function set_statuses(from)
  for i = from, #ARGV, 2 do
    local seq, status = ARGV[i], ARGV[i + 1]
    touch(seq)
    redis.call('HSET', statuses, seq, status)
    redis.call('ZREMRANGEBYSCORE', live, seq, seq)
    if status == '${LIVE}' then redis.call('ZADD', live, seq, seq .. ':' .. redis.call('HGET', hashes, seq)) end
    if status ~= '${PENDING}' then redis.call('SREM', pend, seq) end
  end
  if from <= #ARGV then
    redis.call('HSET', meta, 'updated_at', stamp)
    if redis.call('SCARD', pend) == 0 then redis.call('SREM', pending, tenant .. '/' .. id) end
  end
end

-- Append (body, hash) pairs ARGV[from..to]: seqs come from next_seq inside the script, never shared.
local function append(status, from, to)
  ensure()
  local first = tonumber(redis.call('HGET', meta, 'next_seq'))
  local n = (to - from + 1) / 2
  for i = 0, n - 1 do
    local seq, h = first + i, ARGV[from + 1 + 2 * i]
    redis.call('HSET', body, seq, ARGV[from + 2 * i])
    redis.call('HSET', hashes, seq, h)
    redis.call('HSET', statuses, seq, status)
    if status == '${LIVE}' then
      redis.call('ZADD', live, seq, seq .. ':' .. h)
      touch(seq)
    end
    if status == '${PENDING}' then redis.call('SADD', pend, seq) end
  end
  if status == '${PENDING}' and n > 0 then redis.call('SADD', pending, tenant .. '/' .. id) end
  redis.call('HSET', meta, 'next_seq', first + n, 'updated_at', stamp)
  return first
end
