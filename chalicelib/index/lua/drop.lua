-- Compare-and-delete: remove DELETING locations whose id still matches, release their
-- usage, unlink them from their parent, and hand packed groups whose last block is gone
-- to the orphan set (their files are deleted next, retried until done).
-- A gone record unlinked when it turned DELETING (prelude unlink_from_parent) was taken
-- off its parent's count then. Otherwise it is taken off only if it was linked to the
-- parent's current record (start.lua, "Child counts"): not if that record was written
-- after it, the one that counted it being gone.
-- KEYS: [1] usage, [2] storage table, [3] group refcounts, [4] orphan groups,
--       [5] occupied buckets, [6] pending deletions (mark.lua: the entry goes with the location).
-- ARGV: [1] victims blob (VICTIM_FMT), [2] block size per spec group (I6 each),
--       [3] bucket key prefix.
-- Every location dropped is DELETING, so its bytes leave the deleting counters too.
-- Returns {locations dropped, orphan groups blob (PACKED_GROUP_FMT each),
--          bytes freed, keys freed, type, bytes, ...}.
local usage, stab, groups, orphans, occupied = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local victims, sizes = ARGV[1], ARGV[2]
local bucket_prefix = ARGV[3]
local nbuckets = bucket_count(meta_of(bucket_prefix))
local dropped = 0
local released = {}
local storage_info = {}
local function storage(sidx)
  local info = storage_info[sidx]
  if not info then
    local r = redis.call('HMGET', stab, '#' .. sidx, 't' .. sidx)
    info = {r[1] or '', r[2] or ''}
    storage_info[sidx] = info
  end
  return info[1], info[2]
end

-- Counter changes are summed and applied once at the end: a batch is one atomic step
-- anyway, and most of a victim's cost would otherwise be counter calls.
local bytes_freed, keys_freed, by_type, by_storage, by_group = 0, 0, {}, {}, {}
local marks_freed = 0  -- tiered Marks gone with their records (the instance's 'mk')
local emptied, emptied_list = {}, {}
for v = 1, #victims / VICTIM_LEN do
  local key, loc, sidx, sg, group, slot = struct.unpack(VICTIM_FMT, victims, (v - 1) * VICTIM_LEN + 1)
  local bucket = bucket_of(bucket_prefix, nbuckets, key)
  local rec = redis.call('HGET', bucket, key)
  local i = rec and find_loc(rec, loc)
  if i and loc_status(rec, i) == DELETING then
    local size = struct.unpack('>I6', sizes, sg * 6 + 1)
    local seq = sequence(rec)
    rec = remove_loc(rec, i)
    redis.call('ZREM', KEYS[6], struct.pack(SESSION_ENTRY_FMT, key, loc))
    local flags = byte(rec, H_FLAGS)
    local sname, stype = storage(sidx)
    bytes_freed = bytes_freed + size
    by_type[stype] = (by_type[stype] or 0) + size
    by_storage[sname] = (by_storage[sname] or 0) + size
    if location_count(rec) == 0 then
      redis.call('HDEL', bucket, key)
      keys_freed = keys_freed + 1
      if has_flag(flags, MARKED) then marks_freed = marks_freed + 1 end
      if not emptied[bucket] then
        emptied[bucket] = true
        emptied_list[#emptied_list + 1] = {bucket, bucket_index(nbuckets, key)}
      end
      if has_flag(flags, HAS_PARENT) and not has_flag(flags, UNLINKED) then
        local parent = struct.unpack(H_PARENT_FMT, rec, H_PARENT)
        local pbucket = bucket_of(bucket_prefix, nbuckets, parent)
        local prec = redis.call('HGET', pbucket, parent)
        if prec and linked_to(prec, flags, seq, rec) then
          redis.call('HSET', pbucket, parent, set_children(prec, -1))
        end
      end
    else
      redis.call('HSET', bucket, key, rec)
    end
    local gfield = struct.pack(PACKED_GROUP_FMT, sidx, group)
    by_group[gfield] = (by_group[gfield] or 0) + 1
    dropped = dropped + 1
  end
end

local out = {dropped, '', bytes_freed, keys_freed}
if dropped > 0 then
  redis.call('HINCRBY', usage, 'keys', -keys_freed)
  redis.call('HINCRBY', usage, 'dk', -keys_freed)
  release_bytes(usage, bytes_freed, by_type, by_storage, true, out)
end
if marks_freed > 0 then redis.call('HINCRBY', usage, 'mk', -marks_freed) end
for _, entry in ipairs(emptied_list) do
  if redis.call('EXISTS', entry[1]) == 0 then redis.call('SREM', occupied, entry[2]) end
end
-- Only packed groups are counted (file backends); others have no entry to release.
for gfield, count in pairs(by_group) do
  if redis.call('HEXISTS', groups, gfield) == 1 then
    if redis.call('HINCRBY', groups, gfield, -count) <= 0 then
      redis.call('HDEL', groups, gfield)
      redis.call('SADD', orphans, gfield)
      released[#released + 1] = gfield
    end
  end
end
out[2] = table.concat(released)
return out
