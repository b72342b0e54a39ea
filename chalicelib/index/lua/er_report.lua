-- One reportEvent request of one reporter, applied in order, atomically (reporters.py).
-- KEYS: reporter state, locations hash, the reporter's block-key set, the instance's reporter set
-- ARGV: rid, now ms, fresh token, snapshot min interval ms, heartbeat timeout ms,
--       cleanup grace ms, events (JSON array, reporters.py encodes them)
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

local function find(locs, medium)
  for i, loc in ipairs(locs) do
    if loc[1] == rid and loc[2] == medium then return i end
  end
  return nil
end
local function versioned(uri, version)
  return uri .. (string.find(uri, '?', 1, true) and '&' or '?') .. 's_version=' .. version
end
local function holds(locs)
  for _, loc in ipairs(locs) do
    if loc[1] == rid then return true end
  end
  return false
end

local function add(key, medium, specs, version, replace)
  local locs = er_decode(redis.call('HGET', loc_key, key))
  local i = find(locs, medium)
  if not i then
    locs[#locs + 1] = {rid, medium, {}}
    i = #locs
  elseif replace then
    locs[i][3] = {}
  end
  local held = locs[i][3]
  for j = 1, #specs, 2 do
    local name, uri = specs[j], versioned(specs[j + 1], version)
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
  er_store(loc_key, key, locs)
  redis.call('SADD', keyset, key)
end

local function delete(key, medium, names)
  local raw = redis.call('HGET', loc_key, key)
  if not raw then return end
  local locs = er_decode(raw)
  local i = find(locs, medium)
  if not i then return end
  local drop = {}
  for _, name in ipairs(names) do drop[name] = true end
  local kept, held = {}, locs[i][3]
  for k = 1, #held, 3 do
    if not drop[held[k]] then
      kept[#kept + 1], kept[#kept + 2], kept[#kept + 3] = held[k], held[k + 1], held[k + 2]
    end
  end
  if #kept == 0 then table.remove(locs, i) else locs[i][3] = kept end
  if not holds(locs) then redis.call('SREM', keyset, key) end
  er_store(loc_key, key, locs)
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

if state then
  local flat = {}
  for k, v in pairs(state) do flat[#flat + 1] = k; flat[#flat + 1] = v end
  redis.call('HSET', node_key, unpack(flat))
end
local gen = state and state.gen or ''
local required = (not had_generation or gen == '') and 1 or 0
return {codes, gen, required, retry_after, state and state.ret or ''}
