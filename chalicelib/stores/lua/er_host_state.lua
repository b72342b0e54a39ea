-- getHostCacheState's reporters: the visible slots of the live reporters, which the client
-- walks over the keys' bitmaps (reporters.py host_prefixes, host_walk.py). Called inside the
-- MULTI that also reads the bitmaps, so that both are one state of the instance.
-- KEYS: [1] the instance's reporter set, [2] its reporter view; a reporter's state hash is
--       ARGV[2] .. rid (same hash tag, hence the same slot), read only to build a missing
--       view (er_each_visible)
-- ARGV: now ms, state key prefix, kind count K, K x (kind, heartbeat timeout ms). Reporters
--       of another kind are hidden.
-- Returns one msgpack array of [host, slot, signature] per visible slot, the signature
-- ([medium, spec name, ...]) spliced in as stored rather than packed as a string: the
-- client decodes the whole in C (msgspec).
local now, state_prefix, k = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local timeouts = {}
for i = 1, k do timeouts[ARGV[2 + 2 * i]] = tonumber(ARGV[3 + 2 * i]) end
local parts, n = {}, 0
er_each_visible(KEYS[2], KEYS[1], state_prefix, now, timeouts, function(rid, slot, _, sig)
  local host = string.sub(rid, string.find(rid, '#', 1, true) + 1)
  n = n + 1
  parts[n] = '\147' .. cmsgpack.pack(host) .. cmsgpack.pack(slot) .. sig  -- 0x93: an array of 3
end)
-- The array's header: fixarray under 16 items, else array 16 (65 535 slots: a bitmap of
-- 8 KB a key, far past what an instance's reporters use) or array 32.
local header
if n < 16 then
  header = string.char(0x90 + n)
elseif n < 65536 then
  header = string.char(0xdc, math.floor(n / 256), n % 256)
else
  header = string.char(0xdd, math.floor(n / 16777216), math.floor(n / 65536) % 256, math.floor(n / 256) % 256, n % 256)
end
return header .. table.concat(parts)
