-- Tiered Copy, first step (UPSTREAM_V2 §2.11 "Copy" 1-2): per block, a WRITING location on
-- the target storage, in a write session of its own, with usage in the same atomic step.
-- A block is taken when its record holds the named source location SERVING and the target
-- storage holds no location of it covering the source's spec group (storages addressing
-- blocks by key: no location of it at all, their objects would collide). All or nothing
-- under the quotas (the instance's, the group's, the target type's): bytes only, no record
-- is created. The session's 'm' field keeps each block's source location, which
-- finish.lua checks again before it turns a target SERVING; an expired session is failed
-- by the reaper like any other, so an orphan target is deleted.
-- KEYS: [1] meta, [2] usage, [3] storage table, [4] group refcounts, [5] session deadlines,
--       [6] session record. A block named twice is taken once.
-- ARGV: [1] sources (SESSION_ENTRY_FMT each: block key, source location id), [2] now (ms),
--       [3] session id, [4] deadline (ms), [5] target storage name, [6] its type, [7] its
--       pack count (a file per that many blocks copied; 0: addressed by key), [8] block
--       size per spec group (I6 each, index 0 = all specs), [9] group capacity (0 = none), [10] the group's live
--       bytes as last read (this instance's included; -1: not read), [11] type capacity
--       (0 = none), [12] the group's live bytes of the target type (idem), [13] the
--       instance's byte quota (0 = none), [14] bucket prefix, [15] incarnation (claim.lua),
--       [16] instance id (the session's owner), [17] coverage (start.lua ARGV[24]),
--       [18] the number of spec groups, [19] '1' when the target addresses blocks by location,
--       [20] a shard's part of a sharded instance's Copy: per source, its position in the
--       whole call (POSITION_LEN bytes each; kept in the session's 'o' field as start.lua
--       keeps it, so the parts' entries read back in the call's order), or empty,
--       [21] a demote (docs/tiered-storage.md, "Demote instead of delete"): the source
--       storage's type, or empty. The taken blocks' bytes are added to the usage hash's
--       'mt:<type>' (what reclaim counts as freed until the copy ends) and kept in the
--       session's 'v' field ('<type>:<bytes>'), which finish.lua releases whatever the outcome.
-- Returns {START_GRANTED, first location id, per block '1' taken / 'g' source not SERVING
--      (or no record) / 'c' target holds it already (or named before in this call), the
--      target's storage index, bytes added}
--      or {START_REFUSED, reason, shortfall} (REFUSED_INSTANCE, REFUSED_GROUP, REFUSED_TYPE,
--      REFUSED_STORAGES, REFUSED_GONE), writing nothing.
local meta, usage, stab, groups, deadlines, session = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local sources, now_ms, sid, deadline = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local tname, ttype, pack, sizes = ARGV[5], ARGV[6], tonumber(ARGV[7]), ARGV[8]
local group_cap, group_bytes = tonumber(ARGV[9]), tonumber(ARGV[10])
local type_cap, group_type_bytes, instance_cap = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])
local bprefix, owner = ARGV[14], ARGV[16]
local covers, ngroups, by_location = ARGV[17], tonumber(ARGV[18]), ARGV[19] == '1'
local positions = ARGV[20] or ''
local demoted_type = ARGV[21] or ''
local state = redis.call('HMGET', meta, 'inc', 'removing')
if state[2] or (state[1] and state[1] ~= ARGV[15]) then return {START_REFUSED, REFUSED_GONE} end
local nbuckets = bucket_count(meta)
local tidx = tonumber(redis.call('HGET', stab, 'n:' .. tname) or 0)

local n = #sources / SESSION_ENTRY_LEN
local outcome, taken, added = {}, {}, 0
local seen = {}  -- a block named twice gets one target: the second is 'c'
for j = 1, n do
  local key, src = struct.unpack(SESSION_ENTRY_FMT, sources, (j - 1) * SESSION_ENTRY_LEN + 1)
  local bucket = bucket_of(bprefix, nbuckets, key)
  local rec = redis.call('HGET', bucket, key)
  local at = rec and find_loc(rec, src)
  outcome[j] = 'g'
  if seen[key] then
    outcome[j] = 'c'
  elseif at and loc_status(rec, at) == SERVING then
    seen[key] = true
    local _, _, sg = loc_at(rec, at)
    outcome[j] = '1'
    for l = 1, location_count(rec) do
      local st, sidx, lsg = loc_at(rec, l)
      if tidx > 0 and sidx == tidx and (not by_location
          or (st ~= DELETING and (#covers == 0 or byte(covers, sg * ngroups + lsg + 1) == 49))) then
        outcome[j] = 'c'
      end
    end
    if outcome[j] == '1' then
      local size = struct.unpack('>I6', sizes, sg * 6 + 1)
      taken[#taken + 1] = {key, bucket, sg, size}
      added = added + size
    end
  end
end

if #taken > 0 then
  local u = redis.call('HMGET', usage, 'bytes', 'd', 't:' .. ttype, 'dt:' .. ttype)
  local own = tonumber(u[1] or 0) - tonumber(u[2] or 0)
  local own_type = tonumber(u[3] or 0) - tonumber(u[4] or 0)
  -- The other instances' part of the group's usage, never taken below 0 (start.lua).
  local over = own + added - instance_cap
  if instance_cap > 0 and over > 0 then return {START_REFUSED, REFUSED_INSTANCE, over} end
  over = math.max(0, group_bytes - own) + own + added - group_cap
  if group_cap > 0 and over > 0 then return {START_REFUSED, REFUSED_GROUP, over} end
  over = math.max(0, group_type_bytes - own_type) + own_type + added - type_cap
  if type_cap > 0 and over > 0 then return {START_REFUSED, REFUSED_TYPE, over} end
  if tidx == 0 then
    -- A location holds its storage index in one byte.
    if tonumber(redis.call('HGET', meta, 'storages') or 0) >= 255 then return {START_REFUSED, REFUSED_STORAGES} end
    tidx = redis.call('HINCRBY', meta, 'storages', 1)
    redis.call('HSET', stab, 'n:' .. tname, tidx, '#' .. tidx, tname, 't' .. tidx, ttype)
  end
end

local base = 0
if #taken > 0 then
  base = redis.call('HINCRBY', meta, 'loc', #taken) - #taken + 1
  local entries, group, group_counts = {}, 0, {}
  for j, t in ipairs(taken) do
    local key, bucket, sg = t[1], t[2], t[3]
    local loc, slot = base + j - 1, 0
    if pack > 0 then
      -- A file holds the next `pack` blocks copied to this storage; its id is its first block's.
      if (j - 1) % pack == 0 then group = loc end
      slot = (j - 1) % pack
      local gfield = struct.pack(PACKED_GROUP_FMT, tidx, group)
      group_counts[gfield] = (group_counts[gfield] or 0) + 1
    end
    -- One more location, before an adopted record's tail (start.lua's grown path).
    local rec = redis.call('HGET', bucket, key)
    local count = location_count(rec)
    local body = put(sub(rec, 1, loc_pos(count + 1) - 1), H_LOCATION_COUNT, H_LOCATION_COUNT_FMT, count + 1)
    local location = struct.pack(LOC_FMT, WRITING, tidx, sg, loc, pack > 0 and group or 0, slot)
    redis.call('HSET', bucket, key, body .. location .. sub(rec, loc_pos(count + 1)))
    entries[j] = struct.pack(SESSION_ENTRY_FMT, key, loc)
  end
  for gfield, count in pairs(group_counts) do redis.call('HINCRBY', groups, gfield, count) end
  redis.call('HINCRBY', usage, 'bytes', added)
  redis.call('HINCRBY', usage, 't:' .. ttype, added)
  redis.call('HINCRBY', usage, 's:' .. tname, added)
  local kept, order = {}, {}
  for j = 1, n do
    if outcome[j] == '1' then
      kept[#kept + 1] = sub(sources, (j - 1) * SESSION_ENTRY_LEN + 1, j * SESSION_ENTRY_LEN)
      if #positions > 0 then order[#order + 1] = sub(positions, (j - 1) * POSITION_LEN + 1, j * POSITION_LEN) end
    end
  end
  redis.call('HSET', session, 'd', deadline, 'k', table.concat(entries), 'm', table.concat(kept), 's', tidx,
             'c', now_ms, 'i', owner)
  if #order > 0 then redis.call('HSET', session, 'o', table.concat(order)) end
  if #demoted_type > 0 then
    redis.call('HINCRBY', usage, 'mt:' .. demoted_type, added)
    redis.call('HSET', session, 'v', demoted_type .. ':' .. added)
  end
  redis.call('ZADD', deadlines, deadline, sid)
end
return {START_GRANTED, base, table.concat(outcome), tidx, added}
