-- The visible reported locations of some keys (reporters.py visible_locations; getCacheLocation,
-- getCacheMeta, getCacheLocationsByBackend). One call: the reporters are read here.
-- KEYS: [1] the instance's bitmap hash, [2] the instance's reporter set, [3] its reporter view;
--       a reporter's state hash is ARGV[2] .. rid (read only to build a missing view,
--       er_each_visible) and its records hash ARGV[3] .. rid (same hash tag, same slot).
-- ARGV: now ms, state key prefix, records key prefix, kind count K, K x (kind, heartbeat
--       timeout ms), then the block keys (one string, er_fields). Reporters of another kind
--       are hidden.
-- Returns a JSON array, per key, of [rid, medium, [name, uri, version, ...]] with the visible
-- locations only; '' when no reporter is visible (nothing read).
local now, state_prefix, rec_prefix, k = tonumber(ARGV[1]), ARGV[2], ARGV[3], tonumber(ARGV[4])
local timeouts = {}
for i = 1, k do timeouts[ARGV[3 + 2 * i]] = tonumber(ARGV[4 + 2 * i]) end
local reporters, of_rid = {}, {}  -- {rid, visible versions, {{byte, mask}, ...} of its visible slots}
er_each_visible(KEYS[3], KEYS[2], state_prefix, now, timeouts, function(rid, slot, version)
  local reporter = of_rid[rid]
  if not reporter then
    reporter = {rid, {}, {}}
    of_rid[rid], reporters[#reporters + 1] = reporter, reporter
  end
  local byte, mask = er_bit(slot)
  reporter[2][version] = true
  reporter[3][#reporter[3] + 1] = {byte, mask}
end)
if #reporters == 0 then return '' end
table.sort(reporters, function(a, b) return a[1] < b[1] end)

local blob = ARGV[5 + 2 * k]
local keys = er_fields(blob, 1, #blob / 8)
local maps = {}
er_hmget(KEYS[1], keys, maps)
local out = {}
for i = 1, #keys do out[i] = {} end
for _, reporter in ipairs(reporters) do
  local rid, versions, own = reporter[1], reporter[2], reporter[3]
  local held, at = {}, {}  -- the keys whose bitmap has a visible slot of this reporter
  for i, key in ipairs(keys) do
    local map = maps[key]
    if map then
      for _, bm in ipairs(own) do
        if er_has(map, bm[1], bm[2]) then held[#held + 1] = key; at[#at + 1] = i break end
      end
    end
  end
  if #held > 0 then
    local recs = {}
    er_hmget(rec_prefix .. rid, held, recs)
    for n, key in ipairs(held) do
      local raw = recs[key]
      local rec = raw and cmsgpack.unpack(raw)
      if rec and versions[rec[1]] then
        local found = out[at[n]]
        for j = 2, #rec do
          local loc, specs = rec[j], {}
          for s = 2, #loc, 2 do
            specs[#specs + 1], specs[#specs + 2], specs[#specs + 3] = loc[s], loc[s + 1], rec[1]
          end
          found[#found + 1] = {rid, loc[1], specs}
        end
      end
    end
  end
end
return cjson.encode(out)
