-- getHostCacheState over reported locations: each host's prefix of the keys (reporters.py).
-- KEYS: the instance's bitmap hash, then the state hash and the records hash of every
--       reporter of a configured kind (state1, records1, state2, records2, ...)
-- ARGV: now ms, mode ('p' prefix, 'm' Mamba), eagle pop ('1'/'0'), mediums (',', '' = all),
--       full-attention spec names (','), state spec names (','), reporter count R,
--       R x (rid, heartbeat timeout ms), then the block keys in order
-- Returns {host, prefix, ...} for the hosts with a prefix > 0
local bits_key = KEYS[1]
local now, mode, eagle = tonumber(ARGV[1]), ARGV[2], ARGV[3] == '1'
local function csv(text)
  local list = {}
  for w in string.gmatch(text, '[^,]+') do list[#list + 1] = w end
  return list
end
local media = ARGV[4] ~= '' and er_set(string.gsub(ARGV[4], ',', ' ')) or nil
local full, states = csv(ARGV[5]), csv(ARGV[6])
local r = tonumber(ARGV[7])
local first = 8 + 2 * r
local n = #ARGV - first + 1

-- The visible slots of each host: those of its live reporters' visible generations, in the
-- allowed media (a host reporting as L1P5 and L2, or in several media, has several).
local slots, views, reporters_of = {}, {}, {}  -- host -> {{byte, mask}, ...}; rid -> view; host -> rids
for k = 1, r do
  local rid = ARGV[6 + 2 * k]
  local state = hgetall_table(KEYS[2 * k])
  local view = er_view(state, now, tonumber(ARGV[7 + 2 * k]))
  if view then
    local host = string.sub(rid, string.find(rid, '#', 1, true) + 1)
    views[rid] = view
    local list = reporters_of[host] or {}
    list[#list + 1] = {rid, KEYS[2 * k + 1]}
    reporters_of[host] = list
    er_each_slot(state, function(slot, version, medium)
      if er_visible_version(view, version) and (not media or media[medium]) then
        local byte, mask = er_bit(slot)
        local held = slots[host] or {}
        held[#held + 1] = {byte, mask}
        slots[host] = held
      end
    end)
  end
end
if not next(slots) then return {} end

local function holds(map, host)
  for _, bm in ipairs(slots[host]) do
    if er_has(map, bm[1], bm[2]) then return true end
  end
  return false
end

-- The prefix walk: one bitmap per key, read in runs that double in length. The hosts still
-- in the running are tested only when the key's bitmap differs from every one already seen
-- since the last host dropped out (consecutive blocks of a prompt mostly share one).
local prefix, alive, count = {}, {}, 0
local passed = {}  -- bitmaps every live host holds
local pos, step = 1, 256
while pos <= n do
  local last = math.min(pos + step - 1, n)
  local maps = redis.call('HMGET', bits_key, unpack(ARGV, first + pos - 1, first + last - 1))
  for j = 1, last - pos + 1 do
    local map, at = maps[j], pos + j - 1
    if at == 1 then
      for host in pairs(slots) do
        if map and holds(map, host) then alive[host] = true; count = count + 1 end
      end
      passed = {}
      if map then passed[map] = true end
    elseif not (map and passed[map]) then
      local dropped = false
      for host in pairs(alive) do
        if not (map and holds(map, host)) then
          alive[host], prefix[host], count, dropped = nil, at - 1, count - 1, true
        end
      end
      if dropped then passed = {} end
      if map then passed[map] = true end
    end
    if count == 0 then break end
  end
  if count == 0 then break end
  pos, step = last + 1, math.min(step * 2, 4096)  -- unpack stays under Lua's stack limit (8000)
end
for host in pairs(alive) do prefix[host] = n end

local result = {}
if mode == 'p' then
  for host, length in pairs(prefix) do
    if eagle then length = math.max(length - 1, 0) end
    if length > 0 then result[#result + 1] = host; result[#result + 1] = length end
  end
  return result
end

-- Mamba: within its plain prefix (which bounds the full-attention one), a host's visible
-- spec names are read from its records: the full-attention prefix, then the longest prefix
-- ending on a block that carries every state spec.
local function has_all(set, names)
  for _, name in ipairs(names) do
    if not set[name] then return false end
  end
  return true
end
for host, bound in pairs(prefix) do
  local names_at = {}  -- position -> set of visible spec names
  for p = 1, bound do names_at[p] = {} end
  for _, reporter in ipairs(reporters_of[host]) do
    local view = views[reporter[1]]
    for s = 1, bound, 4000 do
      local last = math.min(s + 3999, bound)
      local raws = redis.call('HMGET', reporter[2], unpack(ARGV, first + s - 1, first + last - 1))
      for j = 1, last - s + 1 do
        if raws[j] then
          local rec = cmsgpack.unpack(raws[j])
          if er_visible_version(view, rec[1]) then
            local set = names_at[s + j - 1]
            for l = 2, #rec do
              local loc = rec[l]
              if not media or media[loc[1]] then
                for k = 2, #loc, 2 do set[loc[k]] = true end
              end
            end
          end
        end
      end
    end
  end
  local full_prefix = bound
  for p = 1, bound do
    if not has_all(names_at[p], full) then full_prefix = p - 1 break end
  end
  local limit = eagle and math.max(full_prefix - 1, 0) or full_prefix
  local length = 0
  for p = limit, 1, -1 do
    if has_all(names_at[p], states) then length = p break end
  end
  if length > 0 then result[#result + 1] = host; result[#result + 1] = length end
end
return result
