ensure()
local target = ({fwd = fwd, rw = rw, meta = meta})[ARGV[4]]
for i = 5, #ARGV, 2 do
  redis.call('HSET', target, ARGV[i], ARGV[i + 1])
  if target ~= meta then touch(ARGV[i]) end
end
commit()
return 1
