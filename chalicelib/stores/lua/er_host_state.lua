-- getHostCacheState over reported locations: each host's prefix of the keys (reporters.py).
-- KEYS: locations hash, then the state hash and the block-key set of every reporter
--       of the instance (state1, keys1, state2, keys2, ...)
-- ARGV: now ms, mode ('p' prefix, 'm' Mamba), eagle pop ('1'/'0'), mediums (',', '' = all),
--       full-attention spec names (','), state spec names (','), reporter count R,
--       R x (rid, heartbeat timeout ms), then the block keys in order
-- Returns {host, prefix, ...} for the hosts with a prefix > 0
local loc_key = KEYS[1]
local now, mode, eagle = tonumber(ARGV[1]), ARGV[2], ARGV[3] == '1'
local function csv(text)
  local list = {}
  for w in string.gmatch(text, '[^,]+') do list[#list + 1] = w end
  return list
end
local media = ARGV[4] ~= '' and er_set(string.gsub(ARGV[4], ',', ' ')) or nil
local full, states = csv(ARGV[5]), csv(ARGV[6])
local r = tonumber(ARGV[7])
local views, hosts, keysets = {}, {}, {}
local settled = true  -- every visible reporter has no retired generation left
for i = 1, r do
  local rid = ARGV[6 + 2 * i]
  local view = er_view(hgetall_table(KEYS[2 * i]), now, tonumber(ARGV[7 + 2 * i]))
  views[rid] = view
  hosts[rid] = string.sub(rid, string.find(rid, '#', 1, true) + 1)
  keysets[rid] = KEYS[2 * i + 1]
  if view and next(view.ret) then settled = false end
end
local first = 8 + 2 * r
local n = #ARGV - first + 1

-- Fast path (plain prefix, every medium, no retired generation left): a reporter holds a
-- visible location for exactly the keys of its block-key set, so each host's prefix is
-- found with SMISMEMBER over growing runs of keys, never decoding a record.
if mode == 'p' and not media and settled then
  local by_host = {}
  for rid, view in pairs(views) do
    if view then
      local list = by_host[hosts[rid]] or {}
      list[#list + 1] = keysets[rid]
      by_host[hosts[rid]] = list
    end
  end
  local result = {}
  for host, sets in pairs(by_host) do
    local pos, step, prefix = 1, 64, nil
    while pos <= n and not prefix do
      local last = math.min(pos + step - 1, n)
      local held = redis.call('SMISMEMBER', sets[1], unpack(ARGV, first + pos - 1, first + last - 1))
      for k = 2, #sets do  -- a host reporting as L1P5 and L2: either holds the key
        local flags = redis.call('SMISMEMBER', sets[k], unpack(ARGV, first + pos - 1, first + last - 1))
        for j = 1, #flags do if flags[j] == 1 then held[j] = 1 end end
      end
      for j = 1, last - pos + 1 do
        if held[j] == 0 then prefix = pos + j - 2 break end
      end
      pos, step = last + 1, math.min(step * 2, 4096)  -- unpack stays under Lua's stack limit
    end
    prefix = prefix or n
    if eagle then prefix = math.max(prefix - 1, 0) end
    if prefix > 0 then
      result[#result + 1] = host
      result[#result + 1] = prefix
    end
  end
  return result
end

-- host -> set of visible spec names at one key (Mamba), or host -> true.
local function present(key)
  local found = {}
  for _, loc in ipairs(er_decode(redis.call('HGET', loc_key, key))) do
    local view = views[loc[1]]
    if view and (not media or media[loc[2]]) then
      local names = er_visible_specs(view, loc[3])
      if names then
        local host = hosts[loc[1]]
        if mode == 'm' then
          local set = found[host] or {}
          for _, name in ipairs(names) do set[name] = true end
          found[host] = set
        else
          found[host] = true
        end
      end
    end
  end
  return found
end
local function has_all(set, names)
  for _, name in ipairs(names) do
    if not set[name] then return false end
  end
  return true
end

local alive, count, result = {}, 0, {}
local last_ok, prev_ok = {}, {}
local function finish(host, prefix)
  alive[host] = nil
  count = count - 1
  local length = prefix
  if mode == 'm' then
    local limit = eagle and math.max(prefix - 1, 0) or prefix
    length = (last_ok[host] <= limit) and last_ok[host] or prev_ok[host]
  elseif eagle then
    length = math.max(prefix - 1, 0)
  end
  if length > 0 then
    result[#result + 1] = host
    result[#result + 1] = length
  end
end

for i = 1, n do
  local found = present(ARGV[first + i - 1])
  if i == 1 then
    for host in pairs(found) do
      alive[host] = true
      count = count + 1
      last_ok[host], prev_ok[host] = 0, 0
    end
  end
  for host in pairs(alive) do
    local here = found[host]
    if not here or (mode == 'm' and not has_all(here, full)) then
      finish(host, i - 1)
    elseif mode == 'm' and has_all(here, states) then
      prev_ok[host], last_ok[host] = last_ok[host], i
    end
  end
  if count == 0 then break end
end
for host in pairs(alive) do finish(host, n) end
return result
