-- The visible reported locations of some keys (reporters.py; getCacheLocation,
-- getCacheMeta, getCacheLocationsByBackend). One call: the reporters are read here.
-- KEYS: [1] locations hash, [2] the instance's reporter set; a reporter's state hash is
--       ARGV[2] .. rid (same hash tag, hence the same slot).
-- ARGV: now ms, state key prefix, kind count K, K x (kind, heartbeat timeout ms), then the
--       block keys. Reporters of another kind are hidden.
-- Returns a JSON array, per key, of [rid, medium, [name, uri, version, ...]] with only the
-- visible specs of the visible locations; '' when no reporter is visible (nothing read).
local now, state_prefix, k = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local timeouts = {}
for i = 1, k do timeouts[ARGV[2 + 2 * i]] = tonumber(ARGV[3 + 2 * i]) end
local views, any = {}, false
for _, rid in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  local timeout = timeouts[string.match(rid, '^[^#]*')]
  if timeout then
    views[rid] = er_view(hgetall_table(state_prefix .. rid), now, timeout)
    any = any or views[rid] ~= nil
  end
end
if not any then return '' end
local out = {}
for i = 4 + 2 * k, #ARGV do
  local found = {}
  for _, loc in ipairs(er_decode(redis.call('HGET', KEYS[1], ARGV[i]))) do
    local view = views[loc[1]]
    local names = view and er_visible_specs(view, loc[3])
    if names then
      local keep, specs = {}, {}
      for _, name in ipairs(names) do keep[name] = true end
      for j = 1, #loc[3], 3 do
        if keep[loc[3][j]] then
          specs[#specs + 1], specs[#specs + 2], specs[#specs + 3] = loc[3][j], loc[3][j + 1], loc[3][j + 2]
        end
      end
      found[#found + 1] = {loc[1], loc[2], specs}
    end
  end
  out[#out + 1] = found
end
return cjson.encode(out)
