-- Free ranges, each only while its owner is the one named.
-- ARGV: capacity, then (address, owner) pairs.
-- Returns the number of ranges freed.
local cap = tonumber(ARGV[1])
sync_capacity(cap)
local freed = 0
for i = 2, #ARGV, 2 do
  local member, s, l, owner = used_at(ARGV[i])
  if member and owner == ARGV[i + 1] then
    free_used(member, s, l, cap)
    freed = freed + 1
  end
end
return freed
