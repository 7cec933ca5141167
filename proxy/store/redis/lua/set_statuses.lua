-- ARGV[4..] = (seq, status) pairs.
local refused = check_statuses(4)
if refused then return refused end
set_statuses(4)
commit()
return 1
