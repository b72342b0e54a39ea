-- Delete every field of the service-wide metrics hash whose tags hold one pair, in one
-- step (a removed instance's series). The hash holds a few fields per metric series, so a
-- full pass is cheap and removals are rare.
-- KEYS: [1] metrics hash. ARGV: [1] the pair as it stands in a field's JSON, ["key","value"].
local gone = {}
for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.find(field, ARGV[1], 1, true) then gone[#gone + 1] = field end
end
for i = 1, #gone, 1000 do redis.call('HDEL', KEYS[1], unpack(gone, i, math.min(i + 999, #gone))) end
return #gone
