-- The stored locations of one key as JSON (reporters.py; reads and tests).
-- KEYS: locations hash. ARGV: block key
local locs = er_decode(redis.call('HGET', KEYS[1], ARGV[1]))
if #locs == 0 then return '[]' end
return cjson.encode(locs)
