-- getHostCacheState over reported locations: each host's prefix of the keys (reporters.py).
-- KEYS: locations hash, then the state hash of every reporter of the instance
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
local views, hosts = {}, {}
for i = 1, r do
  local rid = ARGV[6 + 2 * i]
  views[rid] = er_view(hgetall_table(KEYS[1 + i]), now, tonumber(ARGV[7 + 2 * i]))
  hosts[rid] = string.sub(rid, string.find(rid, '#', 1, true) + 1)
end
local first = 8 + 2 * r

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

local n = #ARGV - first + 1
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
