-- Refresh the recency of records a read served (index/reads.py): the read found each one's
-- access due and decided its new LFU counter; this stores them, atomically per record.
-- KEYS: [1] meta, then the bucket of each key, in order, named for the bucket count ARGV[2].
-- ARGV: keys blob (8 bytes per key), that bucket count, now (s), touch interval (s), the new
--       LFU counters (a byte per key).
-- A record refreshed since the read (its access no longer due) or gone is left as it is:
-- only the access time and the LFU counter change, so whatever else changed since (a
-- location finished, marked DELETING) stays.
-- Returns the number of records refreshed.
local keys, now = ARGV[1], tonumber(ARGV[3])
local n = #keys / 8
-- KEYS[i + 1] is key i's bucket, unless buckets split since the read: named here then.
local buckets, nbuckets = KEYS, bucket_count(KEYS[1])
if nbuckets ~= tonumber(ARGV[2]) then
  buckets = {}
  local bprefix = sub(KEYS[1], 1, -2) .. 'b:'  -- '<tag>:m' -> '<tag>:b:'
  for i = 1, n do buckets[i + 1] = bucket_of(bprefix, nbuckets, sub(keys, i * 8 - 7, i * 8)) end
end
local stale = now - tonumber(ARGV[4])
local stamp = struct.pack(H_LAST_ACCESS_S_FMT, now)
local lfu = ARGV[5]
local refreshed = 0
for i = 1, n do
  local key = sub(keys, i * 8 - 7, i * 8)
  local rec = redis.call('HGET', buckets[i + 1], key)
  if rec and struct.unpack(H_LAST_ACCESS_S_FMT, rec, H_LAST_ACCESS_S) <= stale then
    -- one concatenation: the LFU counter follows the access time
    redis.call('HSET', buckets[i + 1], key, sub(rec, 1, H_LAST_ACCESS_S - 1) .. stamp .. sub(lfu, i, i) .. sub(rec, H_LFU + 1))
    refreshed = refreshed + 1
  end
end
return refreshed
