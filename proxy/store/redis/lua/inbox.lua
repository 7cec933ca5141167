-- ARGV[4] = 'ids' then the ids to read, or 'seqs' then the seqs whose messages to read. Returns
-- flat (id, body, delivery or '', status of the delivery's item or '') quadruples.
local ids = {}
if ARGV[4] == 'ids' then
  for i = 5, #ARGV do ids[#ids + 1] = ARGV[i] end
else
  for i = 5, #ARGV do for _, mid in ipairs(anchor_ids(ARGV[i])) do ids[#ids + 1] = mid end end
end
local out = {}
for _, mid in ipairs(ids) do
  local message = redis.call('HGET', inbox, mid)
  if message then
    local delivery = redis.call('HGET', idel, mid) or ''
    local status = ''
    if delivery ~= '' then status = redis.call('HGET', statuses, string.match(delivery, '^(%d+):')) or '' end
    out[#out + 1] = mid
    out[#out + 1] = message
    out[#out + 1] = delivery
    out[#out + 1] = status
  end
end
return out
