-- One reportEvent request of one reporter, applied in order, atomically (reporters.py).
-- KEYS: reporter state, locations hash, the reporter's block-key set, the instance's reporter set
-- ARGV: rid, now ms, fresh token, snapshot min interval ms, heartbeat timeout ms,
--       cleanup grace ms, events (a JSON array; reporters.py encodes them):
--       ['r', mediums] | ['h'] | ['x'] | ['a', key, medium, [name, uri, ...]]
--       | ['d', key, medium, names] | ['s', [[key, medium, [name, uri, ...]], ...]]
-- Returns {item codes, generation token, snapshot required (0/1), retry after ms,
--          retired tokens to clean ('' = none)}
local OK, NODE_NOT_REGISTERED, SNAPSHOT_RATE_LIMITED = 1, 10, 13
local node_key, loc_key, keyset, nodes = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local rid, now, token = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local min_interval, timeout, grace = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local events = cjson.decode(ARGV[7])

local state = hgetall_table(node_key)
local function retire()
  if state.gen ~= '' then state.ret = (state.ret == '' and '' or state.ret .. ' ') .. state.gen end
  state.gen, state.com, state.strict = '', '', '0'
end
local function fresh(reg)
  state = {reg = reg, med = '', hb = tostring(now), life = '1', gen = '', com = '', strict = '0',
           snap_at = '', ret = ''}
  redis.call('SADD', nodes, rid)
end
-- Past its heartbeat timeout and the grace after it, a reporter is unregistered whether or
-- not the liveness job has run yet.
if state and state.reg == '1' and now - tonumber(state.hb) > timeout + grace then
  retire()
  state.reg, state.life = '0', tostring(tonumber(state.life) + 1)
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

-- The request's keys are read with HMGET up front and written back once at the end: a
-- batch costs a few commands, not three per event.
local cache, dirty, order = {}, {}, {}
local function touch(key) if not dirty[key] then dirty[key] = true; order[#order + 1] = key end end
local wanted, seen = {}, {}
for _, ev in ipairs(events) do
  if ev[1] == 'a' or ev[1] == 'd' then
    if not seen[ev[2]] then seen[ev[2]] = true; wanted[#wanted + 1] = ev[2] end
  elseif ev[1] == 's' then
    for _, item in ipairs(ev[2]) do
      if not seen[item[1]] then seen[item[1]] = true; wanted[#wanted + 1] = item[1] end
    end
  end
end
local CHUNK = 1000
for i = 1, #wanted, CHUNK do
  local last = math.min(i + CHUNK - 1, #wanted)
  local raws = redis.call('HMGET', loc_key, unpack(wanted, i, last))
  for j = i, last do cache[wanted[j]] = er_decode(raws[j - i + 1]) end
end

local function find(locs, medium)
  for i, loc in ipairs(locs) do
    if loc[1] == rid and loc[2] == medium then return i end
  end
  return nil
end
local function holds(locs)
  for _, loc in ipairs(locs) do
    if loc[1] == rid then return true end
  end
  return false
end

local function add(key, medium, specs, version, replace)
  local locs = cache[key]
  if #locs == 0 then  -- a key nobody reported yet (the usual ADD): no merging
    local held = {}
    for j = 1, #specs, 2 do
      held[#held + 1], held[#held + 2], held[#held + 3] = specs[j], specs[j + 1], version
    end
    locs[1] = {rid, medium, held}
    touch(key)
    return
  end
  local i = find(locs, medium)
  if not i then
    locs[#locs + 1] = {rid, medium, {}}
    i = #locs
  elseif replace then
    locs[i][3] = {}
  end
  local held = locs[i][3]
  for j = 1, #specs, 2 do
    local name, uri = specs[j], specs[j + 1]
    local at = nil
    for k = 1, #held, 3 do
      if held[k] == name then at = k break end
    end
    if at then
      held[at + 1], held[at + 2] = uri, version
    else
      held[#held + 1], held[#held + 2], held[#held + 3] = name, uri, version
    end
  end
  touch(key)
end

local shrunk = {}  -- keys a DELETE took something from: does the reporter still hold them?
local function delete(key, medium, names)
  local locs = cache[key]
  local i = find(locs, medium)
  if not i then return end
  shrunk[key] = true
  local drop = {}
  for _, name in ipairs(names) do drop[name] = true end
  local kept, held = {}, locs[i][3]
  for k = 1, #held, 3 do
    if not drop[held[k]] then
      kept[#kept + 1], kept[#kept + 2], kept[#kept + 3] = held[k], held[k + 1], held[k + 2]
    end
  end
  if #kept == 0 then table.remove(locs, i) else locs[i][3] = kept end
  touch(key)
end

local codes, retry_after = {}, 0
for n, ev in ipairs(events) do
  local op, code = ev[1], OK
  if op == 'r' then
    if state == nil then fresh('1')
    elseif state.reg ~= '1' then
      state.reg, state.life = '1', tostring(tonumber(state.life) + 1)
    end
    state.hb = tostring(now)
    local mediums = er_set(string.gsub(state.med, ',', ' '))
    for _, m in ipairs(ev[2]) do
      if not mediums[m] then
        state.med = state.med == '' and m or state.med .. ',' .. m
        mediums[m] = true
      end
    end
  elseif op == 'x' then
    if state == nil then fresh('0')
    elseif state.reg == '1' then
      retire()
      state.reg, state.life = '0', tostring(tonumber(state.life) + 1)
    end
  elseif not registered() then
    code = NODE_NOT_REGISTERED
  elseif op == 'h' then
    state.hb = tostring(now)
  elseif op == 'a' then
    add(ev[2], ev[3], ev[4], generation(), false)
  elseif op == 'd' then
    generation()
    delete(ev[2], ev[3], ev[4])
  elseif op == 's' then
    local last = tonumber(state.snap_at ~= '' and state.snap_at or nil)
    if last and now - last < min_interval then
      code, retry_after = SNAPSHOT_RATE_LIMITED, min_interval - (now - last)
    else
      retire()
      for _, item in ipairs(ev[2]) do add(item[1], item[2], item[3], token, true) end
      state.gen, state.com, state.strict, state.snap_at = token, token, '1', tostring(now)
    end
  end
  codes[n] = code
end

local sets, clears, gone, held = {}, {}, {}, {}
for _, key in ipairs(order) do
  local locs = cache[key]
  if #locs == 0 then gone[#gone + 1] = key
  else sets[#sets + 1] = key; sets[#sets + 1] = cmsgpack.pack(locs) end
  if not shrunk[key] or holds(locs) then held[#held + 1] = key else clears[#clears + 1] = key end
end
local function each_chunk(cmd, key, list, step)
  for i = 1, #list, step do
    redis.call(cmd, key, unpack(list, i, math.min(i + step - 1, #list)))
  end
end
each_chunk('HSET', loc_key, sets, 2 * CHUNK)
each_chunk('HDEL', loc_key, gone, CHUNK)
each_chunk('SADD', keyset, held, CHUNK)
each_chunk('SREM', keyset, clears, CHUNK)

if state then
  local flat = {}
  for k, v in pairs(state) do flat[#flat + 1] = k; flat[#flat + 1] = v end
  redis.call('HSET', node_key, unpack(flat))
end
local gen = state and state.gen or ''
local required = (not had_generation or gen == '') and 1 or 0
return {codes, gen, required, retry_after, state and state.ret or ''}
