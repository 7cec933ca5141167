if redis.call('EXISTS', KEYS[#KEYS]) == 1 then return -1 end
local failed = 0
for _, seq in ipairs(redis.call('SMEMBERS', pend)) do
  if redis.call('HGET', statuses, seq) == '${PENDING}' then
    redis.call('HSET', statuses, seq, '${FAILED}')
    failed = failed + 1
  end
end
redis.call('DEL', pend)
redis.call('SREM', pending, tenant .. '/' .. id)
if failed > 0 then
  redis.call('HSET', meta, 'updated_at', stamp)
  commit()
end
return failed
