-- Forget blocks without deleting their data (trimCache TS_REMOVE_ALL_META): records whose
-- location id still matches and that have no DELETING location go, their keys are
-- released, their bytes stay charged (the data stays on storage: usage follows what
-- exists) and their locations join the forgotten set, whose data the instance's removal
-- deletes before it releases the charge (release.lua). Records with a DELETING location
-- are left to their deletion, which releases them.
-- KEYS: [1] usage, [2] occupied buckets, [3] forgotten locations (VICTIM_FMT members).
-- ARGV: [1] keys blob, [2] expected location id per key (I5 each), [3] bucket prefix.
-- Returns the number of records forgotten.
local usage, occupied = KEYS[1], KEYS[2]
local keys, expected = ARGV[1], ARGV[2]
local bprefix = ARGV[3]
local nbuckets = bucket_count(meta_of(bprefix))
local forgotten, marks = 0, 0  -- marks: tiered Marks gone with their records (the instance's 'mk')
local emptied, emptied_list = {}, {}
for i = 1, #keys / 8 do
  local key = field(keys, i)
  local bucket = bucket_of(bprefix, nbuckets, key)
  local rec = redis.call('HGET', bucket, key)
  local l = rec and find_loc(rec, struct.unpack('>I5', expected, (i - 1) * 5 + 1))
  if l and not find_status(rec, DELETING) then
    for j = 1, location_count(rec) do
      local _, sidx, sg, id, group, slot = loc_at(rec, j)
      redis.call('SADD', KEYS[3], struct.pack(VICTIM_FMT, key, id, sidx, sg, group, slot))
    end
    redis.call('HDEL', bucket, key)
    forgotten = forgotten + 1
    if has_flag(byte(rec, H_FLAGS), MARKED) then marks = marks + 1 end
    if not emptied[bucket] then
      emptied[bucket] = true
      emptied_list[#emptied_list + 1] = {bucket, bucket_index(nbuckets, key)}
    end
  end
end
if forgotten > 0 then redis.call('HINCRBY', usage, 'keys', -forgotten) end
if marks > 0 then redis.call('HINCRBY', usage, 'mk', -marks) end
for _, entry in ipairs(emptied_list) do
  if redis.call('EXISTS', entry[1]) == 0 then redis.call('SREM', occupied, entry[2]) end
end
return forgotten
