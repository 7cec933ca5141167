-- ARGV[4] = seq, ARGV[5] = placement, ARGV[6] = turn. Returns the status of item seq, then flat
-- (id, body, delivery) triples.
local seq, placement, turn = ARGV[4], ARGV[5], ARGV[6]
local anchor_status = redis.call('HGET', statuses, seq) or '${PENDING}'
local anchor_pending = anchor_status == '${PENDING}'
local open = redis.call('SMEMBERS', iopen)
table.sort(open, function(a, b) return tonumber(a) < tonumber(b) end)
local out = {anchor_status}
for _, mid in ipairs(open) do
  local before = redis.call('HGET', idel, mid)
  local take = true
  if before then
    local before_seq = string.match(before, '^(%d+):')
    local status = redis.call('HGET', statuses, before_seq)
    if status and status ~= '${FAILED}' and status ~= '${PENDING}' then
      take = false  -- its item is live (or was, and moved on): delivered for good
      redis.call('SREM', iopen, mid)
    else
      drop_anchor(before_seq, mid)
    end
  end
  if take then
    local delivery = seq .. ':' .. placement .. ':' .. turn .. ':' .. stamp
    redis.call('HSET', idel, mid, delivery)
    local ids = anchor_ids(seq)
    ids[#ids + 1] = mid
    redis.call('HSET', iat, seq, table.concat(ids, ','))
    touch(seq)
    if not anchor_pending then redis.call('SREM', iopen, mid) end
    out[#out + 1] = mid
    out[#out + 1] = redis.call('HGET', inbox, mid)
    out[#out + 1] = delivery
  end
end
redis.call('HSET', meta, 'inbox_open', redis.call('SCARD', iopen))
commit()
return out
