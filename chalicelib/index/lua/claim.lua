-- Bind one shard's key space to one registration (its incarnation) and set its first
-- bucket level (2^bits buckets, which starts grow: prelude grow_buckets) at first use;
-- shard 0 also keeps the instance's shard layout (docs/instance-sharding.md).
-- KEYS: [1] meta, [2] occupied buckets.
-- ARGV: [1] bucket bits wanted, [2] incarnation, [3] '1' when the caller is registering
--       this incarnation (it may take over from an earlier one), '0' otherwise,
--       [4] the shard layout wanted: the hash-tag suffixes of shards 1.. joined by ','
--       ('' for one shard, and always '' for a shard other than 0),
--       [5] '1' when a shard other than this one of the layout in force holds blocks,
--       [6] the last location id before this shard's first (shard s: s * 2^36, so ids
--       never collide across shards; 0 for shard 0).
-- Returns {bucket bits, outcome, shard layout in force}: CLAIM_OK; CLAIM_UNTRACKED
-- (written before the occupied-bucket set existed: the caller builds it); CLAIM_STALE
-- (another incarnation owns the key space: the caller's view of the instance is out of
-- date); CLAIM_OCCUPIED (registering, but an earlier incarnation's blocks are still here:
-- the caller drops them, then claims again).
-- The shard layout changes only with the incarnation, over an empty key space: blocks
-- never sit in a shard their key does not map to. The buckets start again from ARGV[1]
-- then too (nothing is left in them).
local meta, occupied = KEYS[1], KEYS[2]
local wanted, incarnation, registering = ARGV[1], ARGV[2], ARGV[3] == '1'
local wanted_shards, others_hold, first_loc = ARGV[4], ARGV[5] == '1', ARGV[6]
local m = redis.call('HMGET', meta, 'bits', 'ob', 'inc', 'sfx')
if not m[1] then
  redis.call('HSET', meta, 'bits', wanted, 'ob', 1, 'inc', incarnation, 'sfx', wanted_shards)
  if first_loc ~= '0' then redis.call('HSETNX', meta, 'loc', first_loc) end
  return {tonumber(wanted), CLAIM_OK, wanted_shards}
end
local shards = m[4] or ''
if m[3] and m[3] ~= incarnation then
  if not registering then return {tonumber(m[1]), CLAIM_STALE, shards} end
  if not m[2] or others_hold or redis.call('SCARD', occupied) > 0 then
    return {tonumber(m[1]), CLAIM_OCCUPIED, shards}
  end
  shards = wanted_shards
  redis.call('HSET', meta, 'sfx', shards, 'bits', wanted)
  redis.call('HDEL', meta, 'n')
  m[1] = wanted
end
if m[3] ~= incarnation then redis.call('HSET', meta, 'inc', incarnation) end
if not m[2] then return {tonumber(m[1]), CLAIM_UNTRACKED, shards} end
return {tonumber(m[1]), CLAIM_OK, shards}
