-- One reportEvent request of one reporter, applied in order, atomically (reporters.py).
-- KEYS: reporter state, the reporter's records hash, the instance's bitmap hash, the instance's
--       reporter set, free-slot zset, next-slot counter, the instance's reporter view
-- ARGV: rid, now ms, fresh token, snapshot min interval ms, heartbeat timeout ms,
--       cleanup grace ms, '1' when no block key is named twice (else '0'), then the events, flat (reporters.py encodes them; ``loc`` is a
--       msgpack [medium, name, uri, ...], ``sig`` its signature [medium, name, ...],
--       ``names`` a msgpack array):
--       'r', n, n mediums | 'h' | 'x' | 'a', sig, n, msgpack [key, loc, ...]  (n ADDs of one signature)
--       | 'd', key, medium, names | 's', n, msgpack [key, sig, loc, ...]
-- Returns {item codes as runs (code, count, code, count, ...), generation token,
--          snapshot required (0/1), retry after ms, retired tokens to clean ('' = none),
--          1 when the reporter is new to the instance's reporter set (else 0)}
-- OK, NODE_NOT_REGISTERED, SNAPSHOT_RATE_LIMITED: ErrorCode's values (reporters.lua_codes).
local node_key, rec_key, bits_key, nodes, free_key, next_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local view_key = KEYS[7]
local rid, now, token = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local min_interval, timeout, grace = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local FIRST = 8

local state = hgetall_table(node_key)
local joined = 0
local committed = false  -- a snapshot of this request committed
local function retire() er_retire(state) end
-- Unregisters the reporter (HOST_DOWN, or past its timeout and grace): its generation is
-- retired and the manager forgets it, as upstream does, so its next snapshot after a new
-- registration is not held to the old one's rate limit.
local function unregister()
  retire()
  state.reg, state.life, state.snap_at = '0', tostring(tonumber(state.life) + 1), ''
end
local function fresh(reg)
  state = {reg = reg, med = '', hb = tostring(now), life = '1', gen = '', com = '', strict = '0',
           snap_at = '', ret = ''}
  joined = redis.call('SADD', nodes, rid)
end
-- Past its heartbeat timeout and the grace after it, a reporter is unregistered whether or
-- not the liveness job has run yet.
if state and state.reg == '1' and now - tonumber(state.hb) > timeout + grace then
  unregister()
end
local had_generation = state ~= nil and state.gen ~= ''

-- A registered reporter (created lazily), or false for a tombstone.
local function registered()
  if state == nil then fresh('1') end
  return state.reg == '1'
end
local function generation()
  if state.gen == '' then state.gen = token end
  return state.gen
end

-- The slot of (generation, signature); a new one when ``create`` and there is none.
local function slot_of(version, sig, create)
  local field = 'slot:' .. version .. ':' .. sig
  local slot = state[field]
  if slot or not create then return tonumber(slot) end
  local popped = redis.call('ZPOPMIN', free_key)
  if #popped > 0 then slot = tonumber(popped[1]) else slot = redis.call('INCR', next_key) - 1 end
  state[field] = tostring(slot)
  return slot
end

-- The block keys the request names: their bitmaps are read up front (one HMGET), and the
-- records of the keys this reporter already holds (a bit of one of its slots set) too; a
-- key new to the reporter (the usual ADD) needs no read. Everything is written back once.
local keys, runs = {}, {}  -- runs: ARGV index of an ADD run or a snapshot -> its unpacked array
local i = FIRST
while i <= #ARGV do
  local op = ARGV[i]
  if op == 'a' then
    local run = cmsgpack.unpack(ARGV[i + 3])
    runs[i] = run
    for j = 1, #run, 2 do keys[#keys + 1] = run[j] end
    i = i + 4
  elseif op == 'd' then
    keys[#keys + 1] = ARGV[i + 1]
    i = i + 4
  elseif op == 's' then
    local run = cmsgpack.unpack(ARGV[i + 2])
    runs[i] = run
    for j = 1, #run, 3 do keys[#keys + 1] = run[j] end
    i = i + 3
  elseif op == 'r' then
    i = i + 2 + tonumber(ARGV[i + 1])
  else
    i = i + 1
  end
end

-- ``distinct`` (from the client): no key is named twice, so a new key's record and bitmap
-- need not be kept here for later events of the request. Only keys that have a bitmap are
-- kept in ``maps`` (a new key, the usual ADD, costs no table entry).
local maps, recs = {}, {}  -- key -> bitmap / this reporter's record (absent: none)
local map_writes, rec_writes = er_writes(), er_writes()
local distinct = ARGV[FIRST - 1] == '1'
if #keys > 0 then
  local own = {}  -- this reporter's slots as {byte, mask}
  if state then
    er_each_slot(state, function(slot)
      local byte, mask = er_bit(slot)
      own[#own + 1] = {byte, mask}
    end)
  end
  local holds, held = {}, {}  -- bitmap -> has a bit of ours (one test per distinct map)
  for c = 1, #keys, 2000 do
    local last = math.min(c + 1999, #keys)
    local raws = redis.call('HMGET', bits_key, unpack(keys, c, last))
    for j = c, last do
      local map = raws[j - c + 1]
      if map then
        local key = keys[j]
        maps[key] = map
        local h = holds[map]
        if h == nil then
          h = false
          for _, bm in ipairs(own) do
            if er_has(map, bm[1], bm[2]) then h = true break end
          end
          holds[map] = h
        end
        if h then held[#held + 1] = key end
      end
    end
  end
  if #held > 0 then er_hmget(rec_key, held, recs) end
end

local function set_record(key, value)
  recs[key] = value
  er_put(rec_writes, key, value)
end
local function set_map(key, value)
  if maps[key] == value then return end
  maps[key] = value
  er_put(map_writes, key, value)
end
local function clear_slot(key, version, sig)
  local slot = slot_of(version, sig, false)
  if slot then set_map(key, er_clearbit(maps[key], slot)) end
end
-- Clears the bits of every location of a record that is being dropped or replaced.
local function unset_locations(key, rec)
  for j = 2, #rec do clear_slot(key, rec[1], er_signature(rec[j])) end
end

-- Bitmaps with one slot set, memoised per slot: most keys share a bitmap (the same hosts
-- hold a prompt's blocks, and a new key has none), so each is computed once.
local set_memo = {}
local function slot_memo(slot)
  local memo = set_memo[slot]
  if not memo then memo = {}; set_memo[slot] = memo end
  return memo
end
local function set_slot(key, slot)
  local memo, map = slot_memo(slot), maps[key] or ''
  local new = memo[map]
  if not new then new = er_setbit(map, slot); memo[map] = new end
  set_map(key, new)
end

-- Merge one location (msgpack [medium, name, uri, ...]) into the key's record under
-- ``version``: by spec name, overwriting that spec's URI and keeping its siblings.
-- ``head`` is the msgpack prefix of a one-location record of ``version``, ``slot`` that of
-- ``loc`` as sent (its signature's).
local function add(key, loc, version, slot, head)
  local fresh_record = head .. loc
  local old = recs[key]
  if not old then  -- the usual ADD: a key new to this reporter, stored as sent
    set_record(key, fresh_record)
  elseif old ~= fresh_record then
    local rec = cmsgpack.unpack(old)
    if rec[1] ~= version then  -- an older generation's record: retired already, replaced
      unset_locations(key, rec)
      set_record(key, fresh_record)
    else
      local specs = cmsgpack.unpack(loc)
      local at = nil
      for j = 2, #rec do
        if rec[j][1] == specs[1] then at = rec[j] break end
      end
      if not at then
        rec[#rec + 1] = specs
      else  -- the location's signature may change: its bit moves to the new one's slot
        local before = er_signature(at)
        for s = 2, #specs, 2 do
          local found = false
          for k = 2, #at, 2 do
            if at[k] == specs[s] then at[k + 1] = specs[s + 1]; found = true break end
          end
          if not found then at[#at + 1] = specs[s]; at[#at + 1] = specs[s + 1] end
        end
        local after = er_signature(at)
        if after ~= before then clear_slot(key, version, before) end
        slot = slot_of(version, after, true)
      end
      set_record(key, cmsgpack.pack(rec))
    end
  end
  set_slot(key, slot)
end
local function record_head(version)
  return ER_RECORD1 .. cmsgpack.pack(version)
end

local function delete(key, medium, names)
  local old = recs[key]
  if not old then return end
  local rec = cmsgpack.unpack(old)
  local at = nil
  for j = 2, #rec do
    if rec[j][1] == medium then at = j break end
  end
  if not at then return end
  local drop = {}
  for _, name in ipairs(cmsgpack.unpack(names)) do drop[name] = true end
  local loc, kept = rec[at], {medium}
  for k = 2, #loc, 2 do
    if not drop[loc[k]] then kept[#kept + 1] = loc[k]; kept[#kept + 1] = loc[k + 1] end
  end
  if #kept == #loc then return end
  clear_slot(key, rec[1], er_signature(loc))
  if #kept > 1 then
    rec[at] = kept
    set_slot(key, slot_of(rec[1], er_signature(kept), true))
  else
    table.remove(rec, at)
  end
  set_record(key, #rec > 1 and cmsgpack.pack(rec) or false)
end

local codes, retry_after = {}, 0  -- runs: code, count, ...
local function result(code, count)
  local n = #codes
  if n > 0 and codes[n - 1] == code then codes[n] = codes[n] + count
  else codes[n + 1], codes[n + 2] = code, count end
end
i = FIRST
while i <= #ARGV do
  local op, code = ARGV[i], OK
  if op == 'a' then
    local sig, n = ARGV[i + 1], tonumber(ARGV[i + 2])
    local ok = registered()
    if ok then
      local version = generation()
      local slot, head = slot_of(version, sig, true), record_head(version)
      local memo, rargs, margs, run = slot_memo(slot), rec_writes.args, map_writes.args, runs[i]
      for j = 1, 2 * n, 2 do
        local key = run[j]
        if recs[key] then
          add(key, run[j + 1], version, slot, head)
        else  -- add() for a key new to this reporter, inlined: most ADDs of a batch
          local rec, rn = head .. run[j + 1], rec_writes.n
          rargs[rn + 1], rargs[rn + 2], rec_writes.n = key, rec, rn + 2
          local map = maps[key] or ''
          local new = memo[map]
          if not new then new = er_setbit(map, slot); memo[map] = new end
          if not distinct then recs[key], maps[key] = rec, new end
          if new ~= map then
            local mn = map_writes.n
            margs[mn + 1], margs[mn + 2], map_writes.n = key, new, mn + 2
          end
        end
      end
    end
    result(ok and OK or NODE_NOT_REGISTERED, n)
    i = i + 4
  else
    if op == 'r' then
      if state == nil then fresh('1')
      elseif state.reg ~= '1' then
        state.reg, state.life = '1', tostring(tonumber(state.life) + 1)
      end
      state.hb = tostring(now)
      local mediums = er_set(string.gsub(state.med, ',', ' '))
      for j = i + 2, i + 1 + tonumber(ARGV[i + 1]) do
        local m = ARGV[j]
        if not mediums[m] then
          state.med = state.med == '' and m or state.med .. ',' .. m
          mediums[m] = true
        end
      end
      i = i + 2 + tonumber(ARGV[i + 1])
    elseif op == 'x' then
      if state == nil then fresh('0')
      elseif state.reg == '1' then
        unregister()
      end
      i = i + 1
    elseif op == 'h' then
      if registered() then state.hb = tostring(now) else code = NODE_NOT_REGISTERED end
      i = i + 1
    elseif op == 'd' then
      if registered() then
        generation()
        delete(ARGV[i + 1], ARGV[i + 2], ARGV[i + 3])
      else
        code = NODE_NOT_REGISTERED
      end
      i = i + 4
    elseif op == 's' then
      local n = tonumber(ARGV[i + 1])
      if not registered() then
        code = NODE_NOT_REGISTERED
      else
        local last = tonumber(state.snap_at ~= '' and state.snap_at or nil)
        if last and now - last < min_interval then
          code, retry_after = SNAPSHOT_RATE_LIMITED, min_interval - (now - last)
        else
          retire()
          local head, run = record_head(token), runs[i]
          for j = 1, 3 * n, 3 do
            add(run[j], run[j + 2], token, slot_of(token, run[j + 1], true), head)
          end
          state.gen, state.com, state.strict, state.snap_at = token, token, '1', tostring(now)
          committed = true
        end
      end
      i = i + 3
    else
      return redis.error_reply('ERR unknown event ' .. tostring(op))
    end
    result(code, 1)
  end
end

er_commit(rec_key, rec_writes)
er_commit(bits_key, map_writes)
if state then
  local flat = {}
  for k, v in pairs(state) do flat[#flat + 1] = k; flat[#flat + 1] = v end
  redis.call('HSET', node_key, unpack(flat))
  er_write_view(view_key, rid, state)
end
local gen = state and state.gen or ''
-- Asked for a snapshot: a reporter that had no generation before the request, or has none
-- now; never by the request whose snapshot just committed.
local required = (not committed and (not had_generation or gen == '')) and 1 or 0
return {codes, gen, required, retry_after, state and state.ret or '', joined}
