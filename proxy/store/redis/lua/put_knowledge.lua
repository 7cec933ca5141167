local versions, times, index, tenants = unpack(KEYS)
local namespace, base = ARGV[1], tonumber(ARGV[2])
if tonumber(redis.call('HGET', index, namespace) or '0') ~= base then return 0 end
local version = base + 1
redis.call('HSET', versions, version, ARGV[4])
redis.call('ZADD', times, ARGV[5], version)
redis.call('HSET', index, namespace, version)
redis.call('SADD', tenants, ARGV[3])
return version
