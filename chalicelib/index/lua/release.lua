-- Release forgotten locations (forget.lua) whose data the caller has deleted: each one
-- still in the forgotten set leaves it, and its bytes leave the usage counters and its
-- packed group's live count (the group's file is deleted already: no orphan entry).
-- Idempotent: a location released twice (two purge steps racing) counts once.
-- KEYS: [1] usage, [2] storage table, [3] group refcounts, [4] forgotten locations.
-- ARGV: [1] victims blob (VICTIM_FMT), [2] block size per spec group (I6 each).
-- Returns {locations released, bytes freed, type, bytes, ...}.
local usage, stab, groups, forgotten = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local victims, sizes = ARGV[1], ARGV[2]
local released, bytes_freed, by_type, by_storage, by_group = 0, 0, {}, {}, {}
local names = {}
for v = 1, #victims / VICTIM_LEN do
  local start = (v - 1) * VICTIM_LEN + 1
  local member = string.sub(victims, start, start + VICTIM_LEN - 1)
  if redis.call('SREM', forgotten, member) == 1 then
    local _, _, sidx, sg, group = struct.unpack(VICTIM_FMT, member)
    local info = names[sidx]
    if not info then
      info = redis.call('HMGET', stab, '#' .. sidx, 't' .. sidx)
      names[sidx] = info
    end
    local size = struct.unpack('>I6', sizes, sg * 6 + 1)
    released, bytes_freed = released + 1, bytes_freed + size
    by_type[info[2] or ''] = (by_type[info[2] or ''] or 0) + size
    by_storage[info[1] or ''] = (by_storage[info[1] or ''] or 0) + size
    local gfield = struct.pack(PACKED_GROUP_FMT, sidx, group)
    by_group[gfield] = (by_group[gfield] or 0) + 1
  end
end
local out = {released, bytes_freed}
if released > 0 then release_bytes(usage, bytes_freed, by_type, by_storage, false, out) end
for gfield, count in pairs(by_group) do
  if redis.call('HEXISTS', groups, gfield) == 1 and redis.call('HINCRBY', groups, gfield, -count) <= 0 then
    redis.call('HDEL', groups, gfield)
  end
end
return out
