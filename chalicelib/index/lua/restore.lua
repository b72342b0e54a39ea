-- Undo a write path eviction whose start was refused after all (mark.lua's inverse for
-- the locations it took): a victim's location turns SERVING again if it is still
-- DELETING under the same id, its record is linked to its parent again (the mark took it
-- off the parent's child count: prelude unlink_from_parent) and the deleting counters
-- move back. The victims were held by the caller, never handed to deletion.
-- KEYS: [1] usage, [2] storage table, [3] pending deletions (mark.lua: the entry goes).
-- ARGV: [1] victims blob (VICTIM_FMT each), [2] bucket prefix,
--       [3] block size per spec group (I6 each).
-- Returns {restored, bytes, keys, type, bytes...}: how many locations serve again and
-- the deleting charge released (for the caller to take off the group's counters).
local blob, bprefix = ARGV[1], ARGV[2]
local nbuckets = bucket_count(meta_of(bprefix))
local restored, bytes, keys, by_type, types = 0, 0, 0, {}, {}
for j = 1, #blob / VICTIM_LEN do
  local key, id, sidx, sg = struct.unpack(VICTIM_FMT, blob, (j - 1) * VICTIM_LEN + 1)
  local bucket = bucket_of(bprefix, nbuckets, key)
  local rec = redis.call('HGET', bucket, key)
  local l = rec and find_loc(rec, id)
  if l and loc_status(rec, l) == DELETING then
    if not has_live(rec) then keys = keys + 1 end
    rec = set_loc_status(rec, l, SERVING)
    redis.call('ZREM', KEYS[3], struct.pack(SESSION_ENTRY_FMT, key, id))
    local flags = byte(rec, H_FLAGS)
    if has_flag(flags, UNLINKED) then
      rec = put(rec, H_FLAGS, H_FLAGS_FMT, bit.band(flags, bit.bnot(UNLINKED)))
      local parent = struct.unpack(H_PARENT_FMT, rec, H_PARENT)
      local pbucket = bucket_of(bprefix, nbuckets, parent)
      local prec = redis.call('HGET', pbucket, parent)
      if prec and linked_to(prec, flags, sequence(rec), rec) then
        redis.call('HSET', pbucket, parent, set_children(prec, 1))
      end
    end
    redis.call('HSET', bucket, key, rec)
    local stype = types[sidx]
    if not stype then
      stype = redis.call('HGET', KEYS[2], 't' .. sidx) or ''
      types[sidx] = stype
    end
    local size = struct.unpack('>I6', ARGV[3], sg * 6 + 1)
    restored, bytes = restored + 1, bytes + size
    by_type[stype] = (by_type[stype] or 0) + size
  end
end
local out = {restored, bytes, keys}
if restored > 0 then
  redis.call('HINCRBY', KEYS[1], 'd', -bytes)
  redis.call('HINCRBY', KEYS[1], 'dk', -keys)
  for stype, size in pairs(by_type) do
    redis.call('HINCRBY', KEYS[1], 'dt:' .. stype, -size)
    out[#out + 1] = stype
    out[#out + 1] = size
  end
end
return out
