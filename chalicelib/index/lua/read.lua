-- Read the records of a list of block keys in one call, serving only SERVING locations.
-- KEYS: [1] meta (routes the call to the instance's slot).
-- ARGV: keys blob (8 bytes per key), mode (1 prefix, 2 batch, 3 sliding window, 4 raw),
--       sw_size, now (s), touch interval (s), LFU decay period (s), bucket prefix, buckets.
-- Returns one blob: per position a u16 length then the record (length 0 = miss).
-- Served records get their last-access time and LFU counter refreshed, at most once per
-- touch interval per block, so hot blocks cost no write.
local keys, mode, sw = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now, interval, decay = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local bprefix, nbuckets = ARGV[7], tonumber(ARGV[8])
local call, byte, sub = redis.call, string.byte, string.sub
local n = #keys / 8
local recs, served, buckets = {}, {}, {}
local count = n
for i = 1, n do
  local key = sub(keys, i * 8 - 7, i * 8)
  local bucket = bucket_of(bprefix, nbuckets, key)
  buckets[i] = bucket
  local rec = call('HGET', bucket, key)
  -- fast path: one location, status byte right after the header
  if rec and (mode == 4 or byte(rec, 24) == SERVING or find_status(rec, SERVING)) then
    recs[i] = rec
    served[i] = true
  else
    recs[i] = rec
    served[i] = false
    if mode == 1 then
      count = i - 1
      break
    end
  end
end

local lo, hi = 1, count
if mode == 3 then
  -- Right-most window of sw consecutive served keys (API.md: reverse roll).
  local base = n - sw
  lo, hi = 1, 0
  while base >= 0 do
    local failed = nil
    for o = 0, sw - 1 do
      if not served[base + o + 1] then failed = o break end
    end
    if failed == nil then
      lo, hi = base + 1, base + sw
      break
    end
    base = base - (sw - failed)
  end
end

local out = {}
for i = 1, count do
  local rec = recs[i]
  if i < lo or i > hi or not served[i] then
    out[#out + 1] = '\0\0'
  else
    if mode ~= 4 then
      local atime = struct.unpack('>I4', rec, 12)
      if now - atime >= interval then
        local lfu = struct.unpack('>B', rec, 16)
        if decay > 0 then
          lfu = lfu - math.floor((now - atime) / decay)
          if lfu < 0 then lfu = 0 end
        end
        if lfu < 255 then
          local base_val = lfu - 5
          if base_val < 0 then base_val = 0 end
          if math.random() < 1.0 / (base_val * 10 + 1) then lfu = lfu + 1 end
        end
        rec = string.sub(rec, 1, 11) .. struct.pack('>I4B', now, lfu) .. string.sub(rec, 17)
        call('HSET', buckets[i], field(keys, i), rec)
      end
    end
    out[#out + 1] = struct.pack('>H', #rec) .. rec
  end
end
return table.concat(out)
