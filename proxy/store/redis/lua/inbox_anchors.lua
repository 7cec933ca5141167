local function anchor_ids(seq)
  local ids = {}
  for mid in string.gmatch(redis.call('HGET', iat, seq) or '', '%d+') do ids[#ids + 1] = mid end
  return ids
end

local function drop_anchor(seq, mid)
  local kept = {}
  for _, other in ipairs(anchor_ids(seq)) do if other ~= mid then kept[#kept + 1] = other end end
  if #kept == 0 then redis.call('HDEL', iat, seq) else redis.call('HSET', iat, seq, table.concat(kept, ',')) end
  touch(seq)
end
