-- getHostCacheState over reported locations: each host's prefix of the keys (reporters.py).
-- KEYS: [1] the instance's bitmap hash, [2] the instance's reporter set, [3] its reporter view;
--       a reporter's state hash is ARGV[7] .. rid (same hash tag, hence the same slot), read
--       only to build a missing view (er_each_visible)
-- ARGV: now ms, mode ('p' prefix, 'm' Mamba), eagle pop ('1'/'0'), mediums (',', '' = all),
--       full-attention spec names (','), state spec names (','), state key prefix, kind
--       count K, K x (kind, heartbeat timeout ms), then the block keys in order as runs
--       (reporters.py key_runs: the first key alone, then runs of up to 4 096 keys, each key
--       a msgpack string of its 8-byte field, so that cmsgpack.unpack hands a run to HMGET
--       as its arguments). Reporters of another kind are hidden.
-- Returns msgpack {host: prefix} for the hosts with a prefix > 0: one bulk string, which the
-- client decodes in C (64 hosts as a RESP array of 128 items cost it 0.1 ms more a call)
local bits_key = KEYS[1]
local now, mode, eagle = tonumber(ARGV[1]), ARGV[2], ARGV[3] == '1'
local function csv(text)
  local list = {}
  for w in string.gmatch(text, '[^,]+') do list[#list + 1] = w end
  return list
end
local media = ARGV[4] ~= '' and er_set(string.gsub(ARGV[4], ',', ' ')) or nil
local full, states = csv(ARGV[5]), csv(ARGV[6])
local state_prefix, k = ARGV[7], tonumber(ARGV[8])
local timeouts = {}
for i = 1, k do timeouts[ARGV[7 + 2 * i]] = tonumber(ARGV[8 + 2 * i]) end
local first_run = 9 + 2 * k
local n = 0
for a = first_run, #ARGV do n = n + #ARGV[a] / 9 end  -- 9 bytes a key (key_runs)

-- The visible slots of each host: those of its live reporters' visible generations whose
-- medium is allowed (a host reporting as L1P5 and L2, or in several media, or with several
-- sets of spec names, has several), each as {byte, mask, set of its spec names, level},
-- ``level`` being what the slot's names give alone (see holds).
local function has_all(set, names)
  for _, name in ipairs(names) do
    if not set[name] then return false end
  end
  return true
end
local function level_of(names)
  if mode == 'p' then return 2 end
  if not has_all(names, full) then return 0 end
  return has_all(names, states) and 2 or 1
end
local slots = {}
local slot_host = {}  -- slot number -> its host, for the visible slots
-- signature -> {medium, set of its spec names, level}: the reporters of an instance share a
-- few signatures, each unpacked once (the set is read only: holds unions into a new table)
local signatures = {}
er_each_visible(KEYS[3], KEYS[2], state_prefix, now, timeouts, function(rid, slot, _, sig)
  local known = signatures[sig]
  if not known then
    local medium_names = cmsgpack.unpack(sig)
    local names = {}
    for j = 2, #medium_names do names[medium_names[j]] = true end
    known = {medium_names[1], names, level_of(names)}
    signatures[sig] = known
  end
  if not media or media[known[1]] then
    local host = string.sub(rid, string.find(rid, '#', 1, true) + 1)
    local byte, mask = er_bit(slot)
    local held = slots[host] or {}
    held[#held + 1] = {byte, mask, known[2], known[3]}
    slot_host[slot] = host
    slots[host] = held
  end
end)
-- cmsgpack packs an empty table as an array: an empty answer is the empty map's byte.
local function answer(prefixes)
  return next(prefixes) and cmsgpack.pack(prefixes) or '\128'
end
if not next(slots) then return answer({}) end

-- What a host holds of a key with bitmap ``map``: plain, 2 (it holds a location) or 0;
-- Mamba, 2 (every full-attention spec and every state spec), 1 (the full-attention specs
-- only) or 0. Across its slots, the spec names add up; one slot alone is its level.
local function holds(map, host)
  if not map then return 0 end
  local set, count = nil, 0
  for _, sl in ipairs(slots[host]) do
    if er_has(map, sl[1], sl[2]) then
      if sl[4] == 2 then return 2 end
      set, count = sl, count + 1
    end
  end
  if count <= 1 then return set and set[4] or 0 end
  local names = {}
  for _, sl in ipairs(slots[host]) do
    if er_has(map, sl[1], sl[2]) then
      for name in pairs(sl[3]) do names[name] = true end
    end
  end
  return level_of(names)
end

-- The walk: one bitmap per key, read in runs that double in length (key_runs). Hosts are looked at
-- only where the bitmap changes from the previous key's (consecutive blocks of a prompt
-- mostly share one); a host stops at its first key without a (full-attention) location.
-- Mamba also remembers, per host, the last two keys with state (the answer ends on one).
local alive, count, result = {}, 0, {}
local last_ok, prev_ok = {}, {}  -- Mamba: the last and the one-before-last key with state
local function finish(host, prefix)
  alive[host] = nil
  count = count - 1
  local limit = eagle and math.max(prefix - 1, 0) or prefix
  local length = limit
  if mode == 'm' then length = last_ok[host] <= limit and last_ok[host] or prev_ok[host] end
  if length > 0 then result[host] = length end
end
local prev_map, run_start, levels = nil, 1, {}  -- levels: host -> holds() of the current run
-- Where the bitmap changes, only the live hosts owning a slot whose bit changed can change
-- (holds reads a host's own slots only), so a change costs the bitmap's bytes, not a test of
-- every live host (64 hosts: 64 changes x 64 tests). A plain prefix loses a host only where a
-- bit is cleared; Mamba's level moves either way (a state spec's slot set lifts 1 to 2).
local LOW_BIT = {}
for i = 0, 7 do LOW_BIT[2 ^ i] = i end
local function retest_changed(old, new, at)
  local byte, band = string.byte, bit.band
  for b = 1, math.max(#old, new and #new or 0) do
    local was, has = byte(old, b) or 0, new and byte(new, b) or 0
    local changed = mode == 'p' and band(was, bit.bnot(has)) or bit.bxor(was, has)
    while changed ~= 0 do
      local low = band(changed, -changed)
      local host = slot_host[(b - 1) * 8 + LOW_BIT[low]]
      if host and alive[host] then
        local level = holds(new, host)
        if level == 0 then finish(host, at - 1) else levels[host] = level end
      end
      changed = changed - low
    end
  end
end
-- The keys run_start..last all had the current bitmap: the hosts with state there get them.
local function close_run(last)
  if mode ~= 'm' or last < run_start then return end
  for host in pairs(alive) do
    if levels[host] == 2 then
      prev_ok[host] = last > run_start and last - 1 or last_ok[host]
      last_ok[host] = last
    end
  end
end
-- The first key names the candidates: the hosts holding it.
prev_map = redis.call('HGET', bits_key, (cmsgpack.unpack(ARGV[first_run])))
for host in pairs(slots) do
  local level = holds(prev_map, host)
  if level > 0 then
    alive[host], levels[host], last_ok[host], prev_ok[host] = true, level, 0, 0
    count = count + 1
  end
end
-- The inner loop is the cost per key: one comparison while the bitmap stays the same.
local pos = 2
for a = first_run + 1, #ARGV do
  if count == 0 then break end
  local maps = redis.call('HMGET', bits_key, cmsgpack.unpack(ARGV[a]))
  for j = 1, #maps do
    local map = maps[j]
    if map ~= prev_map then
      local at = pos + j - 1
      close_run(at - 1)  -- Mamba: the previous bitmap's run ends before the levels move
      run_start = at
      retest_changed(prev_map, map, at)
      prev_map = map
      if count == 0 then break end
    end
  end
  pos = pos + #maps
end
close_run(n)
for host in pairs(alive) do finish(host, n) end
return answer(result)
