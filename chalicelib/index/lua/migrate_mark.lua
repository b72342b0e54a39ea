-- Tiered Mark (UPSTREAM_V2 §2.11 "Mark"): per block, a Mark {target storage, expiry} at
-- the end of its record (prelude set_mark), so that its next startWriteCache writes it to
-- the target (start.lua). A block is marked when its record holds a SERVING location and
-- the target does not already hold a SERVING or WRITING location covering the spec group
-- of each of them; a Mark already there is replaced (its expiry renewed). The target gets
-- its storage index here when it has none (as start.lua gives one; a sharded instance's
-- caller gives it to every shard first). The instance's Marks (on a sharded instance, the
-- shard's: MigrationIndex.mark runs this in every shard and sums) are counted in its usage
-- hash ('mk'), in the same step.
-- KEYS: [1] meta, [2] usage, [3] storage table.
-- ARGV: [1] keys blob, [2] bucket prefix, [3] target storage name, [4] its type,
--       [5] expiry (ms), [6] spec group coverage (start.lua ARG.covers), [7] the number of
--       spec groups, [8] incarnation (claim.lua).
-- Returns {START_GRANTED, per key '1' marked / 'g' no record or no SERVING location /
--      'c' the target holds it already (or named before in this call), the instance's
--      Marks after} or {START_REFUSED, REFUSED_GONE | REFUSED_STORAGES}, writing nothing.
local meta, usage, stab = KEYS[1], KEYS[2], KEYS[3]
local keys, bprefix, tname, ttype = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local expiry, covers, ngroups = tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7])
local state = redis.call('HMGET', meta, 'inc', 'removing')
if state[2] or (state[1] and state[1] ~= ARGV[8]) then return {START_REFUSED, REFUSED_GONE} end
local nbuckets = bucket_count(meta)
local tidx = tonumber(redis.call('HGET', stab, 'n:' .. tname) or 0)
local outcome, marked, added, seen = {}, {}, 0, {}
for i = 1, #keys / 8 do
  local key = field(keys, i)
  local bucket = bucket_of(bprefix, nbuckets, key)
  local rec = redis.call('HGET', bucket, key)
  outcome[i] = 'g'
  if seen[key] then
    outcome[i] = 'c'
  elseif rec then
    seen[key] = true
    local serving, covered, on_target = false, true, false
    for l = 1, location_count(rec) do
      local st, sidx, sg = loc_at(rec, l)
      if st == SERVING and sidx ~= tidx then
        serving = true
        covered = covered and tidx > 0 and live_on(rec, tidx, sg, covers, ngroups)
      end
      on_target = on_target or (st == SERVING and sidx == tidx)
    end
    if (serving and covered) or (on_target and not serving) then
      outcome[i] = 'c'
    elseif serving then
      outcome[i] = '1'
      marked[#marked + 1] = {bucket, key}
    end
  end
end
if #marked > 0 and tidx == 0 then
  -- A Mark holds its target's storage index in one byte, as a location does.
  if tonumber(redis.call('HGET', meta, 'storages') or 0) >= 255 then return {START_REFUSED, REFUSED_STORAGES} end
  tidx = redis.call('HINCRBY', meta, 'storages', 1)
  redis.call('HSET', stab, 'n:' .. tname, tidx, '#' .. tidx, tname, 't' .. tidx, ttype)
end
for _, m in ipairs(marked) do
  local rec = redis.call('HGET', m[1], m[2])
  if not has_flag(byte(rec, H_FLAGS), MARKED) then added = added + 1 end
  redis.call('HSET', m[1], m[2], set_mark(rec, tidx, expiry))
end
-- Read, not moved, when nothing was added: a shard of a sharded instance named no key (or
-- none markable) still answers its count, and writes nothing.
local marks = added > 0 and redis.call('HINCRBY', usage, 'mk', added) or tonumber(redis.call('HGET', usage, 'mk') or 0)
return {START_GRANTED, table.concat(outcome), marks}
