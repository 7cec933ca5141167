if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
local added = {}
for i = 2, #ARGV, 2 do
  if redis.call('HEXISTS', KEYS[2], ARGV[i]) == 0 then
    local n = redis.call('HLEN', KEYS[2]) + 1
    redis.call('HSET', KEYS[2], ARGV[i], n .. ':' .. ARGV[1] .. ':' .. ARGV[i + 1])
    added[#added + 1] = ARGV[i]
  end
end
return added
