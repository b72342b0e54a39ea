-- Drops a reporter's specs of retired generations from a batch of its keys, metadata only
-- (reporters.py; the reporter's URIs are never deleted: KVCM holds no data for them).
-- KEYS: locations hash, the reporter's block-key set
-- ARGV: rid, retired tokens (' '), then block keys
-- Returns the number of locations removed
local loc_key, keyset, rid = KEYS[1], KEYS[2], ARGV[1]
local retired = er_set(ARGV[2])
local removed = 0
for i = 3, #ARGV do
  local key = ARGV[i]
  local locs = er_decode(redis.call('HGET', loc_key, key))
  local kept, holds, changed = {}, false, false
  for _, loc in ipairs(locs) do
    if loc[1] == rid then
      local specs, left = loc[3], {}
      for k = 1, #specs, 3 do
        if not retired[specs[k + 2]] then
          left[#left + 1], left[#left + 2], left[#left + 3] = specs[k], specs[k + 1], specs[k + 2]
        end
      end
      if #left < #specs then changed = true end
      if #left > 0 then
        loc[3] = left
        kept[#kept + 1] = loc
        holds = true
      else
        removed = removed + 1
      end
    else
      kept[#kept + 1] = loc
    end
  end
  if not holds then redis.call('SREM', keyset, key) end
  if changed then er_store(loc_key, key, kept) end
end
return removed
