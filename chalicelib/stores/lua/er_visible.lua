-- The visible reported locations of some keys (reporters.py; getCacheLocationsByBackend).
-- KEYS: locations hash, then the state hash of every reporter of the instance
-- ARGV: now ms, reporter count R, R x (rid, heartbeat timeout ms), then the block keys
-- Returns a JSON array, per key, of [rid, medium, [name, uri, version, ...]] with only the
-- visible specs of the visible locations
local now, r = tonumber(ARGV[1]), tonumber(ARGV[2])
local views = {}
for i = 1, r do
  views[ARGV[1 + 2 * i]] = er_view(hgetall_table(KEYS[1 + i]), now, tonumber(ARGV[2 + 2 * i]))
end
local out = {}
for i = 3 + 2 * r, #ARGV do
  local found = {}
  for _, loc in ipairs(er_decode(redis.call('HGET', KEYS[1], ARGV[i]))) do
    local view = views[loc[1]]
    local names = view and er_visible_specs(view, loc[3])
    if names then
      local keep, specs = {}, {}
      for _, name in ipairs(names) do keep[name] = true end
      for k = 1, #loc[3], 3 do
        if keep[loc[3][k]] then
          specs[#specs + 1], specs[#specs + 2], specs[#specs + 3] = loc[3][k], loc[3][k + 1], loc[3][k + 2]
        end
      end
      found[#found + 1] = {loc[1], loc[2], specs}
    end
  end
  out[#out + 1] = found
end
return cjson.encode(out)
