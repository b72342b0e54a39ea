-- Shared by the event-report scripts (reporters.py), prepended at load time.
--
-- Layout under the instance's hash tag T (reporters.py names the keys):
--   T:er:r:<rid>  hash, one per reporter: block key (8 bytes, see er_fields) -> that reporter's record of the key,
--                 msgpack [version, [medium, name, uri, name, uri, ...], [medium, ...], ...]
--                 (one location per medium). ``version`` is the reporter's generation when the
--                 record was written; readers append it to every URI as ``s_version``. All
--                 specs of a record share it: a write in a newer generation replaces a record
--                 of an older one (whose specs were retired, hence hidden, already).
--   T:er:bits     hash: block key -> a bitmap over *slots*. A slot is one (reporter,
--                 generation, signature), the signature being a location's medium and spec
--                 names in order (msgpack [medium, name, ...]); bit s is set exactly when the
--                 slot's reporter has a record of the key in the slot's generation with a
--                 location of the slot's signature. Prefix walks (Mamba's too) thus need no
--                 record: the slots tell the media and spec names each host holds a key in.
--                 Slot s is bit s % 8 of byte s // 8 + 1; trailing zero bytes are trimmed, so
--                 equal sets are equal strings; an empty map is no field.
--   T:er:slots:free  zset of freed slot numbers (reused lowest first, keeping maps short);
--   T:er:slots:next  the next never-used slot number.
-- rid = '<l1p5|l2>#<host_ip_port>' names the reporter; the location id upstream prints is
-- 'kvs#event_report_<type>#<medium>#<host_ip_port>'.
--
-- A reporter's state is a hash: reg ('1' registered, '0' tombstone), med (mediums, ','),
-- hb (last heartbeat, ms), life (lifecycle generation), gen (current generation token),
-- com (committed snapshot token), strict ('1' after a snapshot), snap_at (ms of the last
-- successful snapshot), ret (retired generation tokens, ' '-separated: hidden, cleaned),
-- and 'slot:<token>:<signature>' -> the slot of that generation and signature.
--   T:er:view     hash: rid -> what readers take of a registered reporter, msgpack
--                 [last heartbeat ms, slot, version, signature, ...] over its visible
--                 slots (er_visible_version); no field for a tombstone. Every script changing
--                 a reporter's state rewrites its field in the same step (er_write_view), so
--                 a read takes all reporters in one call, not one per reporter.

local ER_RECORD1 = string.char(0x92)  -- msgpack header of a record with one location

-- Block keys are hash fields of 8 bytes (big-endian int64, reporters.py block_field); a
-- request's keys arrive as one string of them. The fields of keys ``from``..``to`` of it:
local function er_fields(blob, from, to)
  local list, sub = {}, string.sub
  for i = from, to do list[i - from + 1] = sub(blob, 8 * i - 7, 8 * i) end
  return list
end

local function er_set(words)
  local set = {}
  for w in string.gmatch(words or '', '%S+') do set[w] = true end
  return set
end

-- How a reader sees one reporter: nil when hidden (tombstone, or no heartbeat for
-- ``timeout_ms``), else {retired set, strict, committed token}.
local function er_view(state, now, timeout_ms)
  if not state or state.reg ~= '1' then return nil end
  if now - tonumber(state.hb or 0) > timeout_ms then return nil end
  return {ret = er_set(state.ret), strict = state.strict == '1', com = state.com or ''}
end

-- Whether specs of generation ``version`` are visible under ``view``: not retired, and of
-- the committed snapshot when the reporter is strict.
local function er_visible_version(view, version)
  return not view.ret[version] and (not view.strict or version == view.com)
end

-- Retires a reporter state's current generation (its specs hidden at once, cleaned by the
-- liveness job): the reporter is asked for a snapshot by its next report.
local function er_retire(state)
  if state.gen ~= '' then state.ret = (state.ret == '' and '' or state.ret .. ' ') .. state.gen end
  state.gen, state.com, state.strict = '', '', '0'
end

local function hgetall_table(key)
  local flat = redis.call('HGETALL', key)
  if #flat == 0 then return nil end
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end

-- Slots of a reporter state: calls fn(slot, version, signature) for each.
local function er_each_slot(state, fn)
  for field, value in pairs(state) do
    local version, signature = string.match(field, '^slot:([^:]*):(.*)$')
    if version then fn(tonumber(value), version, signature) end
  end
end

-- A reporter state's field of the view (T:er:view), or false for none (unregistered).
local function er_view_entry(state)
  if not state or state.reg ~= '1' then return false end
  local view = er_view(state, 0, math.huge)
  local entry = {tonumber(state.hb or 0)}
  er_each_slot(state, function(slot, version, signature)
    if er_visible_version(view, version) then
      local n = #entry
      entry[n + 1], entry[n + 2], entry[n + 3] = slot, version, signature
    end
  end)
  return cmsgpack.pack(entry)
end

local function er_write_view(view_key, rid, state)
  local entry = er_view_entry(state)
  if entry then redis.call('HSET', view_key, rid, entry) else redis.call('HDEL', view_key, rid) end
end

-- The visible slots of the live reporters of the kinds in ``timeouts`` (kind -> heartbeat
-- timeout ms): calls fn(rid, slot, version, signature) for each. An instance reported to before the
-- view existed (reporters in ``nodes_key``, no view) gets its view here, from the states
-- (``state_prefix`` .. rid).
local function er_each_visible(view_key, nodes_key, state_prefix, now, timeouts, fn)
  if redis.call('EXISTS', view_key) == 0 then
    for _, rid in ipairs(redis.call('SMEMBERS', nodes_key)) do
      er_write_view(view_key, rid, hgetall_table(state_prefix .. rid))
    end
  end
  local flat = redis.call('HGETALL', view_key)
  for i = 1, #flat, 2 do
    local rid = flat[i]
    local timeout = timeouts[string.match(rid, '^[^#]*')]
    if timeout then
      local entry = cmsgpack.unpack(flat[i + 1])
      if now - entry[1] <= timeout then
        for j = 2, #entry, 3 do fn(rid, entry[j], entry[j + 1], entry[j + 2]) end
      end
    end
  end
end

-- The signature of a location {medium, name, uri, name, uri, ...} (reporters.py _signature).
local function er_signature(loc)
  local sig = {loc[1]}
  for k = 2, #loc, 2 do sig[#sig + 1] = loc[k] end
  return cmsgpack.pack(sig)
end

-- The byte (1-based) and bit value of a slot in a bitmap string.
local function er_bit(slot)
  return math.floor(slot / 8) + 1, 2 ^ (slot % 8)
end

local function er_has(map, byte, mask)
  local b = map and string.byte(map, byte)
  return b ~= nil and bit.band(b, mask) ~= 0
end

-- ``map`` (a string, or false for none) with slot ``slot`` set; unchanged maps are the same string.
local function er_setbit(map, slot)
  local byte, mask = er_bit(slot)
  map = map or ''
  local n = #map
  if n < byte then return map .. string.rep('\0', byte - n - 1) .. string.char(mask) end
  local b = string.byte(map, byte)
  if bit.band(b, mask) ~= 0 then return map end
  return string.sub(map, 1, byte - 1) .. string.char(b + mask) .. string.sub(map, byte + 1)
end

-- ``map`` with slot ``slot`` cleared, trailing zero bytes trimmed; false when empty.
local function er_clearbit(map, slot)
  local byte, mask = er_bit(slot)
  if not er_has(map, byte, mask) then return map end
  local b = string.byte(map, byte)
  map = string.sub(map, 1, byte - 1) .. string.char(b - mask) .. string.sub(map, byte + 1)
  map = string.gsub(map, '%z+$', '')
  if map == '' then return false end
  return map
end

-- Pending writes to one hash, laid out as HSET's arguments in order: a key written twice
-- appears twice (HSET keeps the last), false deletes it.
local function er_writes()
  return {args = {}, n = 0, deletes = 0}
end

local function er_put(writes, key, value)
  local n = writes.n
  writes.args[n + 1], writes.args[n + 2], writes.n = key, value, n + 2
  if value == false then writes.deletes = writes.deletes + 1 end
end

local function er_commit(hash, writes)
  local sets, n = writes.args, writes.n
  if writes.deletes > 0 then  -- each key's last value decides
    local last, order = {}, {}
    for i = 1, n, 2 do
      if last[sets[i]] == nil then order[#order + 1] = sets[i] end
      last[sets[i]] = sets[i + 1]
    end
    local gone, kept = {}, {}
    for _, key in ipairs(order) do
      if last[key] then kept[#kept + 1] = key; kept[#kept + 1] = last[key] else gone[#gone + 1] = key end
    end
    for i = 1, #gone, 2000 do redis.call('HDEL', hash, unpack(gone, i, math.min(i + 1999, #gone))) end
    sets, n = kept, #kept
  end
  for i = 1, n, 4000 do redis.call('HSET', hash, unpack(sets, i, math.min(i + 3999, n))) end
end

-- HMGET of ``keys`` (a list) into ``into`` (key -> value or false), in chunks. Returns
-- whether no key was listed twice.
local function er_hmget(hash, keys, into)
  local distinct = true
  for i = 1, #keys, 2000 do
    local last = math.min(i + 1999, #keys)
    local raws = redis.call('HMGET', hash, unpack(keys, i, last))
    for j = i, last do
      local key = keys[j]
      if into[key] ~= nil then distinct = false end
      into[key] = raws[j - i + 1]
    end
  end
  return distinct
end
