-- Drops a reporter's records of retired generations from a batch of its keys, and their
-- bits, metadata only (reporters.py; the reporter's URIs are never deleted: KVCM holds no
-- data for them).
-- KEYS: the reporter's state, its records hash, the instance's bitmap hash
-- ARGV: retired tokens (' '), then block keys
-- Returns the number of locations removed
local state_key, rec_key, bits_key = KEYS[1], KEYS[2], KEYS[3]
local retired = er_set(ARGV[1])
local state = hgetall_table(state_key) or {}
local keys = {}
for i = 2, #ARGV do keys[#keys + 1] = ARGV[i] end
local recs, maps, gone, removed = {}, {}, {}, 0
er_hmget(rec_key, keys, recs)
for _, key in ipairs(keys) do
  local raw = recs[key]
  if raw then
    local rec = cmsgpack.unpack(raw)
    if retired[rec[1]] then
      gone[#gone + 1] = key
      removed = removed + #rec - 1
    end
  end
end
if #gone == 0 then return 0 end
er_hmget(bits_key, gone, maps)
for _, key in ipairs(gone) do
  local rec = cmsgpack.unpack(recs[key])
  for j = 2, #rec do
    local slot = tonumber(state['slot:' .. rec[1] .. ':' .. er_signature(rec[j])])
    if slot then maps[key] = er_clearbit(maps[key], slot) end
  end
end
local rec_writes, map_writes = er_writes(), er_writes()
for _, key in ipairs(gone) do
  er_put(rec_writes, key, false)
  er_put(map_writes, key, maps[key])
end
er_commit(rec_key, rec_writes)
er_commit(bits_key, map_writes)
return removed
