-- The stored locations of one key as JSON, visible or not (reporters.py; reads and tests).
-- KEYS: the records hash of every reporter of the instance. ARGV: block key, then their rids
-- Returns [[rid, medium, [name, uri, version, ...]], ...]
local out = {}
for k = 1, #KEYS do
  local raw = redis.call('HGET', KEYS[k], ARGV[1])
  if raw then
    local rec = cmsgpack.unpack(raw)
    for j = 2, #rec do
      local loc, specs = rec[j], {}
      for s = 2, #loc, 2 do
        specs[#specs + 1], specs[#specs + 2], specs[#specs + 3] = loc[s], loc[s + 1], rec[1]
      end
      out[#out + 1] = {ARGV[k + 1], loc[1], specs}
    end
  end
end
if #out == 0 then return '[]' end
return cjson.encode(out)
