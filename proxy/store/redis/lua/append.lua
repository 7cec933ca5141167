-- ARGV[4] = status, then (body, hash) pairs.
local first = append(ARGV[4], 5, #ARGV)
commit()
return first
