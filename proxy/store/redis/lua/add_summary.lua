-- ARGV[4] = summary JSON, ARGV[5] = its last_seq. The boundary never moves back.
ensure()
local sid = redis.call('HINCRBY', meta, 'summaries', 1)
redis.call('HSET', sums, sid, ARGV[4])
if tonumber(ARGV[5]) > tonumber(redis.call('HGET', meta, 'boundary')) then
  redis.call('HSET', meta, 'boundary', ARGV[5], 'summary_id', sid)
end
commit()
return sid
