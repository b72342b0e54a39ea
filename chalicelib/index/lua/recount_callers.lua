-- Rebuild the open sessions per caller (start.lua's caller_sessions) from the open sessions
-- themselves: each session in the deadlines set naming its caller ('p') counts once for it,
-- which is what finish.lua takes back when it closes. Repairs counts that never came back
-- down (sharded sessions once kept their request positions in 'p', so their finish counted
-- down a field that was not the caller's). One script step: a start or finish of this tag
-- runs wholly before or after it, so the counts it leaves are exact.
-- KEYS: [1] session deadlines, [2] open sessions per caller.
-- ARGV: [1] the name of a session's record without its id ('<tag>:s:').
-- Returns how many callers' counts it changed (0: nothing written).
local counts, changed = {}, 0
for _, sid in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local caller = redis.call('HGET', ARGV[1] .. sid, 'p')
  if caller then counts[caller] = (counts[caller] or 0) + 1 end
end
local stored, kept = redis.call('HGETALL', KEYS[2]), {}
for i = 1, #stored, 2 do
  kept[stored[i]] = true
  if counts[stored[i]] ~= tonumber(stored[i + 1]) then changed = changed + 1 end
end
local fields = {}
for caller, count in pairs(counts) do
  if not kept[caller] then changed = changed + 1 end
  fields[#fields + 1] = caller
  fields[#fields + 1] = count
end
if changed > 0 then
  redis.call('DEL', KEYS[2])
  call_chunked('HSET', KEYS[2], fields)  -- in pairs: chunks are of an even length
end
return changed
