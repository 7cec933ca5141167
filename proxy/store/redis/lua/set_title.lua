if redis.call('EXISTS', meta) == 0 then return 0 end
if ARGV[4] == '' then redis.call('HDEL', meta, 'title') else redis.call('HSET', meta, 'title', ARGV[4]) end
commit()
return 1
