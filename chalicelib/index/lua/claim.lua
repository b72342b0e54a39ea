-- Bind the instance's key space to one registration (its incarnation) and fix its bucket
-- count at first use.
-- KEYS: [1] meta, [2] occupied buckets.
-- ARGV: [1] bucket bits wanted, [2] incarnation, [3] '1' when the caller is registering
--       this incarnation (it may take over from an earlier one), '0' otherwise.
-- Returns {bucket bits, outcome}: CLAIM_OK; CLAIM_UNTRACKED (written before the occupied-bucket
-- set existed: the caller builds it); CLAIM_STALE (another incarnation owns the key space:
-- the caller's view of the instance is out of date); CLAIM_OCCUPIED (registering, but an
-- earlier incarnation's blocks are still here: the caller drops them, then claims again).
local meta, occupied = KEYS[1], KEYS[2]
local wanted, incarnation, registering = ARGV[1], ARGV[2], ARGV[3] == '1'
local m = redis.call('HMGET', meta, 'bits', 'ob', 'inc')
if not m[1] then
  redis.call('HSET', meta, 'bits', wanted, 'ob', 1, 'inc', incarnation)
  return {tonumber(wanted), CLAIM_OK}
end
if m[3] and m[3] ~= incarnation then
  if not registering then return {tonumber(m[1]), CLAIM_STALE} end
  if not m[2] or redis.call('SCARD', occupied) > 0 then return {tonumber(m[1]), CLAIM_OCCUPIED} end
end
if m[3] ~= incarnation then redis.call('HSET', meta, 'inc', incarnation) end
if not m[2] then return {tonumber(m[1]), CLAIM_UNTRACKED} end
return {tonumber(m[1]), CLAIM_OK}
