ensure()
local limit = tonumber(ARGV[4])
if limit ~= nil and tonumber(redis.call('HGET', meta, 'llm_calls') or '0') >= limit then
  return -1
end
local calls = redis.call('HINCRBY', meta, 'llm_calls', 1)
commit()
return calls
