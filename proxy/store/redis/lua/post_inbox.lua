-- ARGV[4] = the message's JSON, ARGV[5] = the most open messages allowed. Returns its id, 0 when
-- there is no such conversation, -1 when the inbox is full.
if redis.call('EXISTS', meta) == 0 then return 0 end
if redis.call('SCARD', iopen) >= tonumber(ARGV[5]) then return -1 end
local mid = redis.call('HINCRBY', meta, 'inbox', 1)
redis.call('HSET', inbox, mid, ARGV[4])
redis.call('SADD', iopen, mid)
redis.call('HSET', meta, 'inbox_open', redis.call('SCARD', iopen))
commit()
return mid
