-- Bind reserved ranges to their blocks.
-- ARGV: (address, unbound tag, owner) triples. Binds ranges still unbound for that tag.
-- Returns how many ranges are now bound to their owner (binding twice is fine).
local bound = 0
for i = 1, #ARGV, 3 do
  local member, s, l, owner = used_at(ARGV[i])
  if member and owner == ARGV[i + 1] then
    redis.call('ZREM', USED, member)
    redis.call('ZREM', PENDING, fmt(s))
    redis.call('ZADD', USED, fmt(s), fmt(s) .. ':' .. fmt(l) .. ':' .. ARGV[i + 2])
    bound = bound + 1
  elseif member and owner == ARGV[i + 2] then
    bound = bound + 1
  end
end
return bound
