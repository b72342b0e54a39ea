-- Mark locations DELETING (they stop serving at once) and return them for deletion.
-- KEYS: [1] usage, [2] storage table, [3] pending deletions (SESSION_ENTRY members,
--       scored by the time their hand-off counts as lost: capacity/stranded.py).
-- ARGV: [1] keys blob, [2] expected location id per key (I5 each) or empty for every
--       location, [3] MARK_SERVING to take SERVING locations only (reclaim), MARK_ANY for WRITING and
--       SERVING (removeCache, trim), and DELETING ones again whose pending deadline is
--       at or before ARGV[7] (lost deletions: removing the block again retries them),
--       MARK_LOST for those lost deletions only (the recovery),
--       [4] bucket prefix, [5] the most
--       children each key may have (>H each) or empty for no limit: the reclaimer takes
--       a block only if no child was added since it read it as a leaf, [6] now (s),
--       [7] lost-deletion time (s, 0: none), [8] block size per spec group (I6 each),
--       [9] the pending deadline (s) of every location returned.
-- A location DELETING without a pending entry (marked before the set existed) counts as
-- lost; a pending entry whose location is no longer DELETING (ARGV[7] > 0 and an
-- expected id) is dropped.
-- Returns {victims blob (VICTIM_FMT descriptors), the deleting charge (prelude
-- deleting_charge: newly DELETING locations only, not lost ones handed over again)...}.
local keys, expected, which, limits = ARGV[1], ARGV[2], ARGV[3], ARGV[5]
local bprefix, now_s, lost_s = ARGV[4], tonumber(ARGV[6]), tonumber(ARGV[7])
local nbuckets = bucket_count(meta_of(bprefix))
local charge = deleting_charge(KEYS[2], ARGV[8])
local pending, deadline = KEYS[3], ARGV[9]
local victims = {}
for i = 1, #keys / 8 do
  local key = field(keys, i)
  local bucket = bucket_of(bprefix, nbuckets, key)
  local rec = redis.call('HGET', bucket, key)
  local want = nil
  if #expected > 0 then want = struct.unpack('>I5', expected, (i - 1) * 5 + 1) end
  local held = false  -- whether the expected location is (now) DELETING
  if rec and #limits > 0
      and struct.unpack(H_CHILDREN_FMT, rec, H_CHILDREN) > struct.unpack('>H', limits, i * 2 - 1) then
    rec = nil
  end
  if rec then
    local changed = false
    for l = 1, location_count(rec) do
      local st, sidx, sg, id, group, slot = loc_at(rec, l)
      local eligible = (st == SERVING and which ~= MARK_LOST) or (which == MARK_ANY and st == WRITING)
      if want == nil or want == id then
        if eligible then
          rec = set_loc_status(rec, l, DELETING)
          charge.add(sidx, sg, rec)
        end
        local entry = struct.pack(SESSION_ENTRY_FMT, key, id)
        held = held or eligible or st == DELETING
        local lost = which ~= MARK_SERVING and st == DELETING and lost_s > 0
          and (tonumber(redis.call('ZSCORE', pending, entry)) or 0) <= lost_s
        if eligible or lost then
          victims[#victims + 1] = struct.pack(VICTIM_FMT, key, id, sidx, sg, group, slot)
          redis.call('ZADD', pending, deadline, entry)  -- a retry counts as lost only after its own grace
          changed = true
        end
      end
    end
    if changed then redis.call('HSET', bucket, key, stamp_deleting(unlink_from_parent(bprefix, nbuckets, rec), now_s)) end
  end
  if want ~= nil and lost_s > 0 and not held then redis.call('ZREM', pending, struct.pack(SESSION_ENTRY_FMT, key, want)) end
end
local out = charge.flush(KEYS[1])
table.insert(out, 1, table.concat(victims))
return out
