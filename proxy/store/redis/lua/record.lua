-- ARGV[4], ARGV[5] = the incarnation and version of the caller's snapshot of the record ('', 0:
-- none). Returns {} when there is no such conversation; {'same'} when the snapshot is current;
-- {'delta', incarnation, version, meta, changes} when the changes since are fewer than a whole
-- read, `changes` flat (seq, live member or '', first-forwarded calls or '', rewritten 1/0, inbox
-- anchor 1/0) per seq that changed; else {'whole', incarnation, version, meta, live, fwd, rw seqs,
-- anchor seqs}, incarnation '' when no snapshot of it can be trusted (it was written without a
-- commit). Meta and fwd as HGETALL's flat (field, value) lists.
local known = redis.call('HMGET', meta, 'incarnation', 'version', 'signed')
local incarnation, version = known[1] or '', known[2] or '0'
if incarnation == '' and redis.call('EXISTS', meta) == 0 then return {} end
if incarnation ~= '' and known[3] ~= signature() then incarnation = '' end
if incarnation ~= '' and incarnation == ARGV[4] then
  if version == ARGV[5] then return {'same'} end
  local since = '(' .. ARGV[5]
  if redis.call('ZCOUNT', chg, since, '+inf') * 2 <= redis.call('ZCARD', live) + 64 then
    local changes = {}
    for _, seq in ipairs(redis.call('ZRANGEBYSCORE', chg, since, '+inf')) do
      changes[#changes + 1] = seq
      changes[#changes + 1] = redis.call('ZRANGEBYSCORE', live, seq, seq)[1] or ''
      changes[#changes + 1] = redis.call('HGET', fwd, seq) or ''
      changes[#changes + 1] = redis.call('HEXISTS', rw, seq)
      changes[#changes + 1] = redis.call('HEXISTS', iat, seq)
    end
    return {'delta', incarnation, version, redis.call('HGETALL', meta), changes}
  end
end
return {'whole', incarnation, version, redis.call('HGETALL', meta), redis.call('ZRANGE', live, 0, -1),
        redis.call('HGETALL', fwd), redis.call('HKEYS', rw), redis.call('HKEYS', iat)}
