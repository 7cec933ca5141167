-- ARGV[4] = live only (1/0), ARGV[5] = after, ARGV[6] = limit (-1: none). Returns flat
-- (seq, body, hash, status) quadruples: one consistent read, one round trip.
local after, limit = tonumber(ARGV[5]), tonumber(ARGV[6])
local seqs = {}
if ARGV[4] == '1' then
  local members
  if limit >= 0 then
    members = redis.call('ZRANGEBYSCORE', live, '(' .. after, '+inf', 'LIMIT', 0, limit)
  else
    members = redis.call('ZRANGEBYSCORE', live, '(' .. after, '+inf')
  end
  for _, m in ipairs(members) do seqs[#seqs + 1] = tonumber(string.match(m, '^(%d+):')) end
else
  local last = tonumber(redis.call('HGET', meta, 'next_seq') or '1') - 1
  if limit >= 0 then last = math.min(last, after + limit) end
  for seq = after + 1, last do seqs[#seqs + 1] = seq end
end
local out = {}
for _, seq in ipairs(seqs) do
  out[#out + 1] = seq
  out[#out + 1] = redis.call('HGET', body, seq)
  out[#out + 1] = redis.call('HGET', hashes, seq)
  out[#out + 1] = redis.call('HGET', statuses, seq)
end
return out
