-- startWriteCache: add a WRITING location for every key that needs one, with usage and
-- the write session in the same atomic step. Under the quotas a start is all or nothing,
-- or, with TAIL.partial = '1', gets the longest leading run of the keys it
-- would write that fits (docs/capacity.md, "Partial grants"): refused only when not even
-- the first one fits, the shortfall then being that key's.
-- KEYS and ARGV by name (chalicelib/index/scripts.py generates the tables KEY, ARG, CAND,
-- TAIL, GRANT and REFUSAL in front of this script: never a position by number here).
-- KEY: meta, usage, storages (storage table), groups (group refcounts), deadlines (session
--   deadlines), session (the session record), occupied (occupied buckets), pending
--   (pending deletions, mark.lua), caller_sessions (open sessions per caller).
-- ARG: keys (blob), now_ms, session_id, deadline_ms, storage_name, storage_type,
--   pack_count (0 = explicit group ids), sizes (block size per spec group, I6 each, index
--   0 = all specs), spec_groups (per key, u8 each), explicit_groups (group id per key, I6
--   each, or empty), group_capacity (0 = none), group_bytes (the group's live bytes as
--   last read, this instance's included; -1: not read), type_capacity (0 = none),
--   group_type_bytes (the group's live bytes of this type, idem), max_keys (0 = none),
--   bucket_prefix, records_per_bucket (buckets split past it: prelude grow_buckets),
--   instance_id (the session's owner), incarnation (claim.lua), max_sessions (the most
--   open write sessions the instance may have, 0 = no limit: a start opens one only when
--   it writes a key), instance_capacity (the instance's own byte quota, the group's
--   instance_quotas; 0 = none), min_replicas (>= 1), stale (SESSION_ENTRY_FMT each: key,
--   location id: SERVING locations whose data the storage reports missing), covers (byte
--   a*S+b+1 is '1' when a location of spec group b holds every spec of spec group a; '':
--   every location covers every group), spec_group_count (S, index 0 included),
--   by_location ('1' when storage_name addresses blocks by location: a key may have
--   several locations there; '0' by key), candidate_count (C, further candidate storages);
-- then C x CAND: name, storage_type, pack_count, type_capacity, group_type_bytes (the
--   group's live bytes of that type), by_location, in the order they are tried, the c-th
--   from ARG.candidate_count + (c - 1) x CAND_ARGS;
-- then TAIL, from ARG.candidate_count + C x CAND_ARGS: partial ('1' for a partial grant,
--   '0' all or nothing), pending_deadline (s, of the stale locations it turns DELETING),
--   caller_cap (the most open sessions one caller may have on the instance, 0 = no limit),
--   caller, positions (a shard's start of a sharded instance: per key, its position in the
--   whole request, POSITION_LEN bytes each; kept in the session's 'o' field, in the order of
--   its entries, for the finish to restore the request's order; '': none kept).
-- Storages are candidates 1 (ARG.storage_name...) to C + 1. A key is written, on the first
-- candidate that may take it, when fewer than ARG.min_replicas of its locations cover its spec
-- group (UPSTREAM_V2 §2.6). Counted: WRITING, SERVING and DELETING locations, stale ones
-- excepted, which turn DELETING here (returned as victims). A candidate may take a key
-- unless it holds a location of it that covers the spec group, or (storages addressing
-- blocks by key: their objects would collide) any location of it. A key whose locations
-- are all DELETING is not written again until they are gone. Explicit group ids
-- (ARG.explicit_groups) and packing apply to the keys written to candidate 1 / to each candidate.
-- Tiered Mark (UPSTREAM_V2 §2.6, §2.11; prelude read_mark): a key whose record is marked
-- for storage T, unexpired, is written again on T (one more location, not masked) when T
-- holds no SERVING or WRITING location covering its spec group, T is one of the candidates
-- and may take it (as above), and the quotas hold with it: the marked keys are admitted in
-- request order while the instance's, the group's and each type's quota hold for the
-- whole write with them. Any other marked key gets the normal write (or none) and keeps
-- its Mark, which finish.lua clears. An expired or malformed Mark is cleared ('mk', the
-- instance's marks, counts them down).
-- Nothing is written for an instance being removed (meta 'removing') or registered again
-- since the caller read its config (another incarnation): {START_REFUSED, REFUSED_GONE}.
-- Returns GRANT {START_GRANTED, first location id, per key the candidate it is written to ('0':
--      not written, else the byte 48 + candidate), the candidates' storage indexes (','),
--      bytes added, stale victims (VICTIM_FMT), records created, the deleting charge of the
--      stale ones (prelude deleting_charge), marks (',': keys written to their Mark's target,
--      expired and malformed Marks cleared, the instance's Marks after), then type, bytes
--      added of that type, ...}
--      or REFUSAL {START_REFUSED, reason, shortfall} with reason REFUSED_INSTANCE,
--      REFUSED_GROUP, REFUSED_TYPE (shortfall in bytes), REFUSED_KEYS (in blocks),
--      REFUSED_STORAGES, REFUSED_SESSIONS or REFUSED_CALLER_SESSIONS. A start with no key
--      to write opens no session.
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
local meta, usage, stab, groups = KEYS[KEY.meta], KEYS[KEY.usage], KEYS[KEY.storages], KEYS[KEY.groups]
local deadlines, session, occupied = KEYS[KEY.deadlines], KEYS[KEY.session], KEYS[KEY.occupied]
-- Per key, the reply names the candidate written to as a digit character (0: none).
local ZERO = string.byte('0')
-- A refusal's reply (no shortfall: a reply of two).
local function refused(reason, shortfall)
  local out = {}
  out[REFUSAL.result], out[REFUSAL.reason], out[REFUSAL.shortfall] = START_REFUSED, reason, shortfall
  return out
end
local keys = ARGV[ARG.keys]
local now_ms, sid, deadline = tonumber(ARGV[ARG.now_ms]), ARGV[ARG.session_id], tonumber(ARGV[ARG.deadline_ms])
local sname, stype, pack = ARGV[ARG.storage_name], ARGV[ARG.storage_type], tonumber(ARGV[ARG.pack_count])
local sizes_blob, sg_blob, explicit = ARGV[ARG.sizes], ARGV[ARG.spec_groups], ARGV[ARG.explicit_groups]
local group_cap, group_bytes = tonumber(ARGV[ARG.group_capacity]), tonumber(ARGV[ARG.group_bytes])
local max_keys = tonumber(ARGV[ARG.max_keys])
local bprefix, per_bucket = ARGV[ARG.bucket_prefix], tonumber(ARGV[ARG.records_per_bucket])
local owner = ARGV[ARG.instance_id]
local state = redis.call('HMGET', meta, 'inc', 'removing')
if state[2] or (state[1] and state[1] ~= ARGV[ARG.incarnation]) then return refused(REFUSED_GONE) end
local nbuckets = bucket_count(meta)
local n = #keys / 8
local fields, buckets = {}, {}
for i = 1, n do
  fields[i] = field(keys, i)
  buckets[i] = bucket_of(bprefix, nbuckets, fields[i])
end
local min_count = tonumber(ARGV[ARG.min_replicas])
local stale, stale_blob = {}, ARGV[ARG.stale]
for j = 1, #stale_blob / SESSION_ENTRY_LEN do
  local key, loc = struct.unpack(SESSION_ENTRY_FMT, stale_blob, (j - 1) * SESSION_ENTRY_LEN + 1)
  stale[key .. loc] = true
end
local covers, ngroups = ARGV[ARG.covers], tonumber(ARGV[ARG.spec_group_count])
-- The candidates in order: name, type, pack count, type capacity, group type bytes, by location.
local cands = {{sname, stype, pack, tonumber(ARGV[ARG.type_capacity]), tonumber(ARGV[ARG.group_type_bytes]),
                ARGV[ARG.by_location] == '1'}}
local ncands = tonumber(ARGV[ARG.candidate_count])
for c = 1, ncands do
  local a = ARG.candidate_count + (c - 1) * CAND_ARGS
  cands[c + 1] = {ARGV[a + CAND.name], ARGV[a + CAND.storage_type], tonumber(ARGV[a + CAND.pack_count]),
                  tonumber(ARGV[a + CAND.type_capacity]), tonumber(ARGV[a + CAND.group_type_bytes]),
                  ARGV[a + CAND.by_location] == '1'}
end
local tail = ARG.candidate_count + ncands * CAND_ARGS
local partial = ARGV[tail + TAIL.partial] == '1'
local pending_deadline = ARGV[tail + TAIL.pending_deadline]
local caller_cap, caller = tonumber(ARGV[tail + TAIL.caller_cap]), ARGV[tail + TAIL.caller]
-- The table maps 'n:<name>' -> index, '#<index>' -> name and 't<index>' -> type.
for _, cand in ipairs(cands) do cand.sidx = tonumber(redis.call('HGET', stab, 'n:' .. cand[1]) or 0) end

local NO_PARENT = string.rep('\0', 8)
local new = {}       -- request positions of keys that get a new record
local written = {}   -- request positions of every key written (new record or one more location)
local grown = {}     -- positions of written keys whose existing record gets one more location
local existed = {}   -- keys that had a record before this call
local prune = {}     -- position -> stale location indexes of its record
local flags = {}
local seen = {}  -- a key repeated in one request is written once
local routed = {}    -- position -> its Mark's candidate, for keys written to their Mark's target
local fallback = {}  -- position -> the candidate a routed key would get without its Mark (false: none)
local fallback_types = {}
local cleared, expired, malformed = {}, 0, 0  -- positions whose Mark is cleared here
local new_bytes, type_bytes = 0, {}
for i = 1, n do
  local key = fields[i]
  local pick = nil
  local sg = byte(sg_blob, i)
  if not seen[key] then
    seen[key] = true
    local rec = redis.call('HGET', buckets[i], key)
    if not rec then
      pick = 1
    else
      local count, live, covering, holding, pruned, live_covering = 0, false, {}, {}, {}, {}
      for l = 1, location_count(rec) do
        local st, sidx, lsg, id = loc_at(rec, l)
        if st == SERVING and stale[key .. id] then
          pruned[#pruned + 1] = l
          holding[sidx] = true  -- a storage addressing by key still has the stale object's name
        else
          live = live or st ~= DELETING
          holding[sidx] = true
          if covers_group(covers, ngroups, sg, lsg) then
            count = count + 1
            covering[sidx] = true
            if st ~= DELETING then live_covering[sidx] = true end
          end
        end
      end
      local target, expiry = read_mark(rec)
      if target == false or (target and expiry <= now_ms) then
        cleared[i] = true
        if target == false then malformed = malformed + 1 else expired = expired + 1 end
        target = nil
      end
      existed[key] = true
      if #pruned > 0 then prune[i] = pruned end
      if (live or #pruned > 0) and count < min_count then
        for c, cand in ipairs(cands) do
          local s = cand.sidx
          if not covering[s] and (cand[6] or not holding[s]) then
            pick = c
            break
          end
        end
      end
      if target and (live or #pruned > 0) and not live_covering[target] then
        for c, cand in ipairs(cands) do
          if cand.sidx == target and (cand[6] or not holding[target]) then
            routed[i], fallback[i] = c, pick or false
            if pick then fallback_types[cands[pick][2]] = true end
            pick = c
            break
          end
        end
      end
      if pick then grown[i] = true end
    end
  end
  if pick then
    written[#written + 1] = i
    if not grown[i] then new[#new + 1] = i end
    local size = struct.unpack('>I6', sizes_blob, sg * 6 + 1)
    new_bytes = new_bytes + size
    local t = cands[pick][2]
    type_bytes[t] = (type_bytes[t] or 0) + size
    flags[i] = string.char(ZERO + pick)
  else
    flags[i] = '0'
  end
end

local function result(base, victims, charge, marks)
  local sidxs = {}
  for c, cand in ipairs(cands) do sidxs[c] = cand.sidx end
  local out = {}
  out[GRANT.result], out[GRANT.first_location_id], out[GRANT.written_to] = START_GRANTED, base, table.concat(flags)
  out[GRANT.storage_indexes], out[GRANT.new_bytes], out[GRANT.victims] = table.concat(sidxs, ','), new_bytes, victims
  out[GRANT.created], out[GRANT.charge], out[GRANT.marks] = #new, table.concat(charge, ','), marks
  local at = GRANT.by_type
  for t, b in pairs(type_bytes) do
    out[at], out[at + 1] = t, b
    at = at + 2
  end
  return out
end

-- Only a start with keys to write opens a session, so only those count against the cap.
local max_sessions = tonumber(ARGV[ARG.max_sessions])
if #written > 0 and max_sessions > 0 and redis.call('ZCARD', deadlines) >= max_sessions then
  return refused(REFUSED_SESSIONS, 1)
end
-- With auth on, one account may hold only part of that budget (the count is the
-- session's 'p' field's: finish.lua takes it back).
local caller_sessions = KEYS[KEY.caller_sessions]
if #written > 0 and caller_cap > 0 and tonumber(redis.call('HGET', caller_sessions, caller) or 0) >= caller_cap then
  return refused(REFUSED_CALLER_SESSIONS, 1)
end

-- The quotas, checked on what the first `count` written keys add (in check order: the
-- instance's bytes, the group's, each candidate type's, the keys): nil when they hold,
-- else the refusal reason and its shortfall.
local quota = nil
if #written > 0 then
  local u = redis.call('HMGET', usage, 'bytes', 'keys', 'd', 'dk')
  local own_bytes = tonumber(u[1] or 0) - tonumber(u[3] or 0)
  local own_keys = tonumber(u[2] or 0) - tonumber(u[4] or 0)
  -- The other instances' part of the group's usage: the group counter lags this
  -- instance's own counters by the changes in flight, so it is never taken below 0.
  local others_bytes = math.max(0, group_bytes - own_bytes)
  local instance_cap = tonumber(ARGV[ARG.instance_capacity])
  local type_room = {}  -- type -> bytes it may still take (nil: no quota)
  for _, cand in ipairs(cands) do
    local t, cap = cand[2], cand[4]
    if (type_bytes[t] or fallback_types[t]) and cap > 0 and not type_room[t] then
      local tu = redis.call('HMGET', usage, 't:' .. t, 'dt:' .. t)
      local own_type = tonumber(tu[1] or 0) - tonumber(tu[2] or 0)
      type_room[t] = cap - math.max(0, cand[5] - own_type) - own_type
    end
  end
  quota = function(bytes, created, by_type)
    local over = own_bytes + bytes - instance_cap
    if instance_cap > 0 and over > 0 then return REFUSED_INSTANCE, over end
    over = others_bytes + own_bytes + bytes - group_cap
    if group_cap > 0 and over > 0 then return REFUSED_GROUP, over end
    for _, cand in ipairs(cands) do
      local room = type_room[cand[2]]
      if room and by_type[cand[2]] and by_type[cand[2]] > room then
        return REFUSED_TYPE, by_type[cand[2]] - room
      end
    end
    over = own_keys + created - max_keys
    if max_keys > 0 and over > 0 then return REFUSED_KEYS, over end
    return nil
  end
  if next(routed) then
    -- The marked keys, in request order, while the quotas hold with them; the others
    -- take their fallback (the bytes are the same, the type may differ) or are not written.
    local bytes, by_type = 0, {}
    local function add(i, c, sign)
      local size = struct.unpack('>I6', sizes_blob, byte(sg_blob, i) * 6 + 1)
      bytes = bytes + sign * size
      by_type[cands[c][2]] = (by_type[cands[c][2]] or 0) + sign * size
    end
    for _, i in ipairs(written) do
      local c = routed[i] and fallback[i] or (not routed[i] and byte(flags[i]) - ZERO)
      if c then add(i, c, 1) end
    end
    for _, i in ipairs(written) do
      if routed[i] then
        local fb = fallback[i]
        if fb then add(i, fb, -1) end
        add(i, routed[i], 1)
        if quota(bytes, #new, by_type) then
          add(i, routed[i], -1)
          if fb then add(i, fb, 1) end
          flags[i], routed[i] = fb and string.char(ZERO + fb) or '0', nil
          if not fb then grown[i] = nil end
        end
      end
    end
    local kept = {}
    for _, i in ipairs(written) do
      if flags[i] ~= '0' then kept[#kept + 1] = i end
    end
    type_bytes = {}
    for t, b in pairs(by_type) do
      if b > 0 then type_bytes[t] = b end
    end
    written, new_bytes = kept, bytes
  end
  local reason, over = quota(new_bytes, #new, type_bytes)
  if reason and not partial then return refused(reason, over) end
  if reason then
    -- A partial grant: the longest leading run of the written keys that fits; the keys
    -- after it are not written (the reply masks them).
    local bytes, created, by_type = 0, 0, {}
    local fit, fit_bytes, fit_types = 0, 0, {}
    for j, i in ipairs(written) do
      local size = struct.unpack('>I6', sizes_blob, byte(sg_blob, i) * 6 + 1)
      local t = cands[byte(flags[i]) - ZERO][2]
      bytes = bytes + size
      by_type[t] = (by_type[t] or 0) + size
      if not grown[i] then created = created + 1 end
      reason, over = quota(bytes, created, by_type)
      if reason then
        if j == 1 then return refused(reason, over) end
        break
      end
      fit, fit_bytes = j, bytes
      for k, v in pairs(by_type) do fit_types[k] = v end
    end
    local granted, kept_written, kept_new = {}, {}, {}
    for j = 1, fit do granted[written[j]] = true end
    for _, i in ipairs(written) do
      if granted[i] then
        kept_written[#kept_written + 1] = i
      else
        flags[i], grown[i] = '0', nil
      end
    end
    for _, i in ipairs(new) do
      if granted[i] then kept_new[#kept_new + 1] = i end
    end
    written, new, new_bytes, type_bytes = kept_written, kept_new, fit_bytes, fit_types
  end
end

for c, cand in ipairs(cands) do
  if cand.sidx == 0 and string.find(table.concat(flags), string.char(ZERO + c), 1, true) then
    -- A location holds its storage index in one byte.
    if tonumber(redis.call('HGET', meta, 'storages') or 0) >= 255 then return refused(REFUSED_STORAGES) end
    cand.sidx = redis.call('HINCRBY', meta, 'storages', 1)
    redis.call('HSET', stab, 'n:' .. cand[1], cand.sidx, '#' .. cand.sidx, cand[1], 't' .. cand.sidx, cand[2])
  end
end
local sidx = cands[1].sidx

local base = 0
local session_keys = {}
local victims = {}
local charge = deleting_charge(stab, sizes_blob)
local now_s = math.floor(now_ms / 1000)
if #written > 0 then
  base = redis.call('HINCRBY', meta, 'loc', #written) - #written + 1
  local group_counts = {}
  -- Children each key gains from this call's new records: a new record is written with its
  -- count at once, an existing parent is updated once, whatever its number of new children.
  local gained = {}
  for _, i in ipairs(new) do
    if i > 1 then gained[fields[i - 1]] = (gained[fields[i - 1]] or 0) + 1 end
  end
  local parent_bucket = {}
  local touched, touched_list = {}, {}
  local storage_bytes = {}
  for j, i in ipairs(written) do
    local key = fields[i]
    local loc = base + j - 1
    local c = byte(flags[i]) - ZERO
    local cand = cands[c]
    local group, slot = 0, 0
    local cpack = cand[3]
    if cpack > 0 then
      -- A file holds the next cpack blocks written to this storage; its id is its first block's.
      cand.j = cand.j or 0
      if cand.j % cpack == 0 then cand.group = loc end
      group, slot = cand.group, cand.j % cpack
      cand.j = cand.j + 1
      local gfield = struct.pack(PACKED_GROUP_FMT, cand.sidx, group)
      group_counts[gfield] = (group_counts[gfield] or 0) + 1
    elseif c == 1 and #explicit > 0 then
      group = struct.unpack('>I6', explicit, (i - 1) * 6 + 1)
    end
    local sg = byte(sg_blob, i)
    storage_bytes[cand[1]] = (storage_bytes[cand[1]] or 0) + struct.unpack('>I6', sizes_blob, sg * 6 + 1)
    local location = struct.pack(LOC_FMT, WRITING, cand.sidx, sg, loc, group, slot)
    if grown[i] then
      -- One more location, before an adopted record's tail (read again: an adoption by
      -- an earlier key of this call may have changed it).
      local rec = redis.call('HGET', buckets[i], key)
      local count = location_count(rec)
      local body = put(sub(rec, 1, loc_pos(count + 1) - 1), H_LOCATION_COUNT, H_LOCATION_COUNT_FMT, count + 1)
      redis.call('HSET', buckets[i], key, body .. location .. sub(rec, loc_pos(count + 1)))
    else
      local hflags, parent = 0, NO_PARENT
      if i > 1 then
        hflags, parent = HAS_PARENT, fields[i - 1]
        parent_bucket[parent] = buckets[i - 1]
      end
      local children = gained[key] or 0
      gained[key] = nil
      -- Adopt the next key if it existed before this call and names this key its parent:
      -- this key had no record, so that child was linked to no record (see the header).
      local n1 = i + 1
      if n1 <= n and existed[fields[n1]] then
        local crec = redis.call('HGET', buckets[n1], fields[n1])
        -- A child on its way out (DELETING, unlinked) is not adopted: it counts no more.
        if crec and has_flag(byte(crec, H_FLAGS), HAS_PARENT) and struct.unpack(H_PARENT_FMT, crec, H_PARENT) == key
            and not find_status(crec, DELETING) then
          local cbody = sub(crec, 1, loc_pos(location_count(crec) + 1) - 1)  -- drops an earlier adopter
          local mark = mark_tail(crec)  -- kept, after the new adopter
          local cflags = HAS_PARENT + ADOPTED + (#mark > 0 and MARKED or 0)
          redis.call('HSET', buckets[n1], fields[n1],
                     put(cbody, H_FLAGS, H_FLAGS_FMT, cflags) .. struct.pack(ADOPTER_FMT, loc) .. mark)
          children = children + 1
        end
      end
      children = math.min(children, MAX_CHILDREN)
      local rec = struct.pack(HDR_FMT, hflags, parent, children, now_s, LFU_INITIAL, now_ms, 1) .. location
      redis.call('HSET', buckets[i], key, rec)
      local b = bucket_index(nbuckets, key)
      if not touched[b] then
        touched[b] = true
        touched_list[#touched_list + 1] = b
      end
    end
    session_keys[#session_keys + 1] = struct.pack(SESSION_ENTRY_FMT, key, loc)
  end
  call_chunked('SADD', occupied, touched_list)
  for parent, count in pairs(gained) do
    local bucket = parent_bucket[parent]
    local prec = redis.call('HGET', bucket, parent)
    if prec then redis.call('HSET', bucket, parent, set_children(prec, count)) end
  end
  for gfield, count in pairs(group_counts) do
    redis.call('HINCRBY', groups, gfield, count)
  end
  redis.call('HINCRBY', usage, 'bytes', new_bytes)
  redis.call('HINCRBY', usage, 'keys', #new)
  for t, b in pairs(type_bytes) do redis.call('HINCRBY', usage, 't:' .. t, b) end
  for name, b in pairs(storage_bytes) do redis.call('HINCRBY', usage, 's:' .. name, b) end
end

-- Stale locations turn DELETING (after the key's new location is in: it stays live).
for i, pruned in pairs(prune) do
  local rec = redis.call('HGET', buckets[i], fields[i])
  for _, l in ipairs(pruned) do
    local _, psidx, psg, id, group, slot = loc_at(rec, l)
    rec = set_loc_status(rec, l, DELETING)
    charge.add(psidx, psg, rec)
    victims[#victims + 1] = struct.pack(VICTIM_FMT, fields[i], id, psidx, psg, group, slot)
    redis.call('ZADD', KEYS[KEY.pending], pending_deadline, struct.pack(SESSION_ENTRY_FMT, fields[i], id))
  end
  redis.call('HSET', buckets[i], fields[i], stamp_deleting(unlink_from_parent(bprefix, nbuckets, rec), now_s))
end

-- Expired and malformed Marks go (read again: the writes above may have changed the record).
local routed_count = 0
for i in pairs(routed) do
  if flags[i] ~= '0' then routed_count = routed_count + 1 end
end
local marks = 0
if next(cleared) then
  for i in pairs(cleared) do
    redis.call('HSET', buckets[i], fields[i], clear_mark(redis.call('HGET', buckets[i], fields[i])))
  end
  marks = redis.call('HINCRBY', usage, 'mk', -(expired + malformed))
elseif routed_count > 0 then
  marks = tonumber(redis.call('HGET', usage, 'mk') or 0)
end

if #written > 0 then
  redis.call('HSET', session, 'd', deadline, 'k', table.concat(session_keys), 's', sidx, 'c', now_ms, 'i', owner)
  redis.call('ZADD', deadlines, deadline, sid)
  local positions = ARGV[tail + TAIL.positions]
  if #positions > 0 then
    local order = {}
    for j, i in ipairs(written) do order[j] = sub(positions, (i - 1) * POSITION_LEN + 1, i * POSITION_LEN) end
    redis.call('HSET', session, 'o', table.concat(order))
  end
  if caller_cap > 0 then
    redis.call('HSET', session, 'p', caller)
    redis.call('HINCRBY', caller_sessions, caller, 1)
  end
end
-- Last: a split moves records, and the bucket names above are the count's before it.
if #new > 0 then grow_buckets(meta, bprefix, occupied, tonumber(redis.call('HGET', usage, 'keys')), per_bucket) end
return result(base, table.concat(victims), charge.flush(usage),
              table.concat({routed_count, expired, malformed, marks}, ','))
