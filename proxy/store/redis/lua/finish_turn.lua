-- ARGV[4] = reply status, ARGV[5] = n, the number of reply items, ARGV[6 .. 5+2n] = their (body, hash)
-- pairs, then the reply's response id ('' = none), then the turn record's JSON ('' = none), then
-- what the record tells of the conversation (TurnFacts): m, m (field, value) pairs for the meta
-- hash, the task ('' = none), the failure's JSON ('' = the turn did not fail); then the turn's
-- upstream calls, f, f (seq, calls) first-forwarded marks, k, k (field, seq) named marks for the
-- meta hash; then (seq, status) changes. Returns the reply's first seq.
local n = tonumber(ARGV[5])
local record_at = 7 + 2 * n
local task_at = record_at + 2 + 2 * tonumber(ARGV[record_at + 1])
local calls_at = task_at + 2
local calls, f = tonumber(ARGV[calls_at]), tonumber(ARGV[calls_at + 1])
local marks_at = calls_at + 2 + 2 * f
local changes_at = marks_at + 1 + 2 * tonumber(ARGV[marks_at])
local refused = check_statuses(changes_at)
if refused then return refused end
if calls > 0 or changes_at > marks_at + 1 then ensure() end
if calls > 0 then redis.call('HINCRBY', meta, 'llm_calls', calls) end
for i = calls_at + 2, marks_at - 1, 2 do
  redis.call('HSET', fwd, ARGV[i], ARGV[i + 1])
  touch(ARGV[i])
end
for i = marks_at + 1, changes_at - 1, 2 do redis.call('HSET', meta, ARGV[i], ARGV[i + 1]) end
set_statuses(changes_at)
local seq = false
if n > 0 then seq = append(ARGV[4], 6, record_at - 2) end
local response_id = ARGV[record_at - 1]
if seq and response_id ~= '' then
  redis.call('HSET', responses, response_id, id .. '${RESPONSE_SEPARATOR}' .. (seq + n - 1))
  redis.call('SADD', resp, response_id)
end
local record = ARGV[record_at]
if record ~= '' then
  ensure()
  local turn = redis.call('HINCRBY', meta, 'turns', 1)
  local reply_seq = seq and tostring(seq) or 'null'
  -- Spliced, not re-encoded: cjson would turn the record's empty lists into objects.
  redis.call('HSET', turns, turn, '{"turn":' .. turn .. ',"reply_seq":' .. reply_seq .. ',"record":' .. record .. '}')
  for i = record_at + 2, task_at - 1, 2 do redis.call('HSET', meta, ARGV[i], ARGV[i + 1]) end
  if ARGV[task_at] ~= '' then redis.call('HSETNX', meta, 'task', ARGV[task_at]) end
  local failure = ARGV[task_at + 1]
  if failure ~= '' then
    if redis.call('HINCRBY', meta, 'failures', 1) == 1 then  -- its first: listed among the failed
      local order = redis.call('HGET', meta, 'order')
      redis.call('ZADD', failed_index, order, id)
      redis.call('ZADD', failed_all, order, tenant .. '/' .. id)
    end
    redis.call('HSET', meta, 'last_error', '{"turn":' .. turn .. ',' .. string.sub(failure, 2))
  end
end
commit()
return seq
