-- Read the records of a list of block keys in one call, serving only SERVING locations.
-- KEYS: the bucket of each block key, in request order.
-- ARGV: keys blob (8 bytes per key), mode (1 prefix, 2 batch, 3 sliding window, 4 raw),
--       sw_size, now (s), touch interval (s), LFU decay period (s).
-- Returns one blob: per position a u16 length then the record (length 0 = miss).
-- Served records get their last-access time and LFU counter refreshed, at most once per
-- touch interval per block, so hot blocks cost no write.
local keys, mode, sw = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now, interval, decay = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local n = #KEYS
local recs, served = {}, {}
local count = n
for i = 1, n do
  local rec = redis.call('HGET', KEYS[i], field(keys, i))
  if rec and (mode == 4 or find_status(rec, SERVING)) then
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
        redis.call('HSET', KEYS[i], field(keys, i), rec)
      end
    end
    out[#out + 1] = struct.pack('>H', #rec) .. rec
  end
end
return table.concat(out)
