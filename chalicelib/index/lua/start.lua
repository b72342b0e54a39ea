-- startWriteCache: add a WRITING location for every key that has no location yet, all
-- or nothing, with usage and the write session in the same atomic step.
-- KEYS: [1] meta, [2] usage, [3] storage table, [4] group refcounts, [5] session
--       deadlines, [6] session record, [7] occupied buckets.
-- ARGV: [1] keys blob, [2] now (ms), [3] session id, [4] deadline (ms), [5] storage name,
--       [6] storage type, [7] pack count (0 = explicit group ids), [8] block size per spec
--       group (I6 each, index 0 = all specs), [9] spec group per key (u8 each),
--       [10] explicit group id per key (I6 each, or empty), [11] group capacity (0 = none),
--       [12] the group's live bytes as last read (this instance's included; -1: not
--       read), [13] type capacity (0 = none), [14] the group's live bytes of this type
--       (idem), [15] max key count (0 = none),
--       [16] bucket prefix, [17] bucket count, [18] instance id (the session's owner),
--       [19] the instance's incarnation (claim.lua), [20] the most open write sessions
--       the instance may have (0 = no limit): every start opens one, new keys or not.
--       [21] the instance's own byte quota (the group's instance_quotas; 0 = none).
-- Nothing is written for an instance being removed (meta 'removing') or registered again
-- since the caller read its config (another incarnation): {START_REFUSED, REFUSED_GONE}.
-- Returns {START_GRANTED, first location id, new-key flags ('1' new / '0' existing), storage
--      index, bytes added} or {START_REFUSED, reason, shortfall} with reason REFUSED_INSTANCE,
--      REFUSED_GROUP, REFUSED_TYPE (shortfall in bytes), REFUSED_KEYS (in blocks),
--      REFUSED_STORAGES or REFUSED_SESSIONS.
--
-- Quotas count live usage: bytes and keys minus what is DELETING ('d', 'dt:<type>',
-- 'dk'), whose data is on its way out (mark.lua, finish.lua charge those counters,
-- drop.lua releases them with the bytes). So space freed by marking victims is
-- writable at once, while 'bytes' keeps following the data that exists.
--
-- Child counts. A record's sequence number is the id of its location: ids come from one
-- counter per instance, a record is created with one location and never gains another,
-- so a key written again gets a record with a higher number than every record that was
-- live before. A record C links to the record R of its parent key P (R counts C) when
--   * C is not adopted and R predates C (seq R < seq C): C was created while R was P's
--     record, and R was counted then (R existed, or was created earlier in the same call);
--   * or C is adopted (flag ADOPTED) by R: R was created after C, C being the key right
--     after P in the request, and C's record ends with R's sequence number (I5, after
--     its locations, ADOPTER_FMT: every reader walks locations by count, so the tail is
--     invisible).
-- Invariant: a record's child count is the number of records linked to it that are not
-- DELETING (a child turning DELETING is unlinked then: prelude unlink_from_parent). A child
-- whose parent record went away while it lived is linked to no record until a later
-- write creates its parent again with it as the next key (adoption); drop.lua decrements
-- a parent only for a child linked to it. Adoption costs one read per new record whose
-- next key already existed, nothing in the usual existing-prefix, new-suffix request.
local meta, usage, stab, groups, deadlines, session = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local occupied = KEYS[7]
local keys = ARGV[1]
local now_ms, sid, deadline = tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local sname, stype, pack = ARGV[5], ARGV[6], tonumber(ARGV[7])
local sizes_blob, sg_blob, explicit = ARGV[8], ARGV[9], ARGV[10]
local group_cap, group_bytes = tonumber(ARGV[11]), tonumber(ARGV[12])
local type_cap, group_type = tonumber(ARGV[13]), tonumber(ARGV[14])
local max_keys = tonumber(ARGV[15])
local bprefix, nbuckets, owner = ARGV[16], tonumber(ARGV[17]), ARGV[18]
local state = redis.call('HMGET', meta, 'inc', 'removing')
if state[2] or (state[1] and state[1] ~= ARGV[19]) then return {START_REFUSED, REFUSED_GONE} end
local max_sessions = tonumber(ARGV[20])
if max_sessions > 0 and redis.call('ZCARD', deadlines) >= max_sessions then
  return {START_REFUSED, REFUSED_SESSIONS, 1}
end
local n = #keys / 8
local fields, buckets = {}, {}
for i = 1, n do
  fields[i] = field(keys, i)
  buckets[i] = bucket_of(bprefix, nbuckets, fields[i])
end

local NO_PARENT = string.rep('\0', 8)
local new = {}
local flags = {}
local seen = {}  -- a key repeated in one request is written once
local new_bytes = 0
for i = 1, n do
  local key = fields[i]
  if not seen[key] and redis.call('HEXISTS', buckets[i], key) == 0 then
    seen[key] = true
    new[#new + 1] = i
    local sg = byte(sg_blob, i)
    new_bytes = new_bytes + struct.unpack('>I6', sizes_blob, sg * 6 + 1)
    flags[i] = '1'
  else
    flags[i] = '0'
  end
end

-- The table maps 'n:<name>' -> index, '#<index>' -> name and 't<index>' -> type.
local sidx = redis.call('HGET', stab, 'n:' .. sname)
local function result(base)
  return {START_GRANTED, base, table.concat(flags), tonumber(sidx or 0), new_bytes}
end

if #new > 0 then
  local u = redis.call('HMGET', usage, 'bytes', 'keys', 't:' .. stype, 'd', 'dk', 'dt:' .. stype)
  local own_bytes = tonumber(u[1] or 0) - tonumber(u[4] or 0)
  local own_keys = tonumber(u[2] or 0) - tonumber(u[5] or 0)
  local own_type = tonumber(u[3] or 0) - tonumber(u[6] or 0)
  -- The other instances' part of the group's usage: the group counter lags this
  -- instance's own counters by the changes in flight, so it is never taken below 0.
  local others_bytes = math.max(0, group_bytes - own_bytes)
  local others_type = math.max(0, group_type - own_type)
  local instance_cap = tonumber(ARGV[21])
  local over = own_bytes + new_bytes - instance_cap
  if instance_cap > 0 and over > 0 then return {START_REFUSED, REFUSED_INSTANCE, over} end
  over = others_bytes + own_bytes + new_bytes - group_cap
  if group_cap > 0 and over > 0 then return {START_REFUSED, REFUSED_GROUP, over} end
  over = others_type + own_type + new_bytes - type_cap
  if type_cap > 0 and over > 0 then return {START_REFUSED, REFUSED_TYPE, over} end
  over = own_keys + #new - max_keys
  if max_keys > 0 and over > 0 then return {START_REFUSED, REFUSED_KEYS, over} end
end

if not sidx then
  -- A location holds its storage index in one byte.
  if tonumber(redis.call('HGET', meta, 'storages') or 0) >= 255 then return {START_REFUSED, REFUSED_STORAGES} end
  sidx = redis.call('HINCRBY', meta, 'storages', 1)
  redis.call('HSET', stab, 'n:' .. sname, sidx, '#' .. sidx, sname, 't' .. sidx, stype)
end
sidx = tonumber(sidx)

local base = 0
local session_keys = {}
if #new > 0 then
  base = redis.call('HINCRBY', meta, 'loc', #new) - #new + 1
  local group_counts = {}
  -- Children each key gains from this call's new keys: a new record is written with its
  -- count at once, an existing parent is updated once, whatever its number of new children.
  local gained = {}
  for _, i in ipairs(new) do
    if i > 1 then gained[fields[i - 1]] = (gained[fields[i - 1]] or 0) + 1 end
  end
  local parent_bucket = {}
  local touched, touched_list = {}, {}
  for j, i in ipairs(new) do
    local key = fields[i]
    local loc = base + j - 1
    local group, slot = 0, 0
    if pack > 0 then
      group = base + math.floor((j - 1) / pack) * pack
      slot = (j - 1) % pack
      group_counts[group] = (group_counts[group] or 0) + 1
    elseif #explicit > 0 then
      group = struct.unpack('>I6', explicit, (i - 1) * 6 + 1)
    end
    local hflags, parent = 0, NO_PARENT
    if i > 1 then
      hflags, parent = HAS_PARENT, fields[i - 1]
      parent_bucket[parent] = buckets[i - 1]
    end
    local children = gained[key] or 0
    gained[key] = nil
    -- Adopt the next key if it existed before this call and names this key its parent:
    -- this key had no record, so that child was linked to no record (see the header).
    local c = i + 1
    if c <= n and flags[c] == '0' and not seen[fields[c]] then
      local crec = redis.call('HGET', buckets[c], fields[c])
      -- A child on its way out (DELETING, unlinked) is not adopted: it counts no more.
      if crec and has_flag(byte(crec, H_FLAGS), HAS_PARENT) and struct.unpack(H_PARENT_FMT, crec, H_PARENT) == key
          and not find_status(crec, DELETING) then
        local body = sub(crec, 1, loc_pos(location_count(crec) + 1) - 1)  -- drops an earlier adopter
        redis.call('HSET', buckets[c], fields[c],
                   put(body, H_FLAGS, H_FLAGS_FMT, HAS_PARENT + ADOPTED) .. struct.pack(ADOPTER_FMT, loc))
        children = children + 1
      end
    end
    children = math.min(children, MAX_CHILDREN)
    local rec = struct.pack(HDR_FMT, hflags, parent, children, math.floor(now_ms / 1000), LFU_INITIAL, now_ms, 1)
      .. struct.pack(LOC_FMT, WRITING, sidx, byte(sg_blob, i), loc, group, slot)
    redis.call('HSET', buckets[i], key, rec)
    local b = bucket_index(nbuckets, key)
    if not touched[b] then
      touched[b] = true
      touched_list[#touched_list + 1] = b
    end
    session_keys[#session_keys + 1] = struct.pack(SESSION_ENTRY_FMT, key, loc)
  end
  sadd_all(occupied, touched_list)
  for parent, count in pairs(gained) do
    local bucket = parent_bucket[parent]
    local prec = redis.call('HGET', bucket, parent)
    if prec then redis.call('HSET', bucket, parent, set_children(prec, count)) end
  end
  for group, count in pairs(group_counts) do
    redis.call('HINCRBY', groups, struct.pack(PACKED_GROUP_FMT, sidx, group), count)
  end
  redis.call('HINCRBY', usage, 'bytes', new_bytes)
  redis.call('HINCRBY', usage, 'keys', #new)
  redis.call('HINCRBY', usage, 't:' .. stype, new_bytes)
  redis.call('HINCRBY', usage, 's:' .. sname, new_bytes)
end

redis.call('HSET', session, 'd', deadline, 'k', table.concat(session_keys), 's', sidx, 'c', now_ms, 'i', owner)
redis.call('ZADD', deadlines, deadline, sid)
return result(base)
