-- Read the records of a list of block keys in one call, serving only SERVING locations.
-- KEYS: [1] meta, [2] storage table, then the bucket of each block key, in order
--       (duplicates allowed), named for the bucket count ARGV[8].
-- ARGV: keys blob (8 bytes per key), mode (MODE_PREFIX, MODE_BATCH, MODE_WINDOW sliding
--       window, MODE_RAW),
--       sw_size, now (s), touch interval (s), LFU decay period (s),
--       servable storages: '' (any) or '\n' followed by their names joined by '\n',
--       the bucket count the caller named the buckets for,
--       optionally keys covered elsewhere: a byte per key, '1' when the key has a visible
--       reported location (cache/service.py): a stored miss there neither ends the prefix
--       nor breaks a window.
-- Returns one blob: per position a u16 length then the record (length 0 = miss); when the
-- buckets have split since the caller's count, {that blob, the bucket count now}: the
-- script then named the buckets itself.
-- A location on a storage that may not serve (disabled, unhealthy, not a candidate) is a
-- miss here, not only when rendered: the window and the prefix are found among blocks
-- that will be served, and only those get their recency refreshed.
-- Served records get their last-access time and LFU counter refreshed, at most once per
-- touch interval per block, so hot blocks cost no write.
--
-- This is the hot path, and one shard's single thread serves every read of an instance:
-- one redis.call per key is the floor (records of random keys sit in distinct buckets),
-- so the loops avoid every other per-key cost they can. The caller names the buckets
-- (docs/index-read-path.md): building a bucket name here cost about a fifth of the
-- script's time, and Valkey time is what caps an instance, not the client's.
local keys, mode, sw = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now, interval, decay = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local call = redis.call
local covered = ARGV[9]
local n = #keys / 8
-- KEYS[i + 2] is key i's bucket, unless the caller's count is out of date (a start split
-- buckets meanwhile): the names are then built here, for this call.
local buckets, nbuckets = KEYS, bucket_count(KEYS[1])
if nbuckets ~= tonumber(ARGV[8]) then
  buckets = {}
  local bprefix = sub(KEYS[1], 1, -2) .. 'b:'  -- '<tag>:m' -> '<tag>:b:'
  for i = 1, n do buckets[i + 2] = bucket_of(bprefix, nbuckets, sub(keys, i * 8 - 7, i * 8)) end
end

-- storage index -> true for storages that may not serve; false when every one may (the
-- usual case, which keeps the per-key check to one byte compare)
local blocked = false
if ARGV[7] ~= '' and mode ~= MODE_RAW then
  local servable = {}
  for name in string.gmatch(ARGV[7], '[^\n]+') do servable[name] = true end
  local table_ = call('HGETALL', KEYS[2])
  for j = 1, #table_, 2 do
    local f = table_[j]
    if byte(f, 1) == 35 and not servable[table_[j + 1]] then  -- '#<index>' -> storage name
      blocked = blocked or {}
      blocked[tonumber(sub(f, 2))] = true
    end
  end
end

local function serves(rec)
  for pos = loc_pos(1), loc_pos(location_count(rec)), LOC_LEN do
    if byte(rec, pos + L_STATUS) == SERVING and not blocked[byte(rec, pos + L_STORAGE_INDEX)] then return true end
  end
  return false
end
local stale = now - interval
local stamp = struct.pack(H_LAST_ACCESS_S_FMT, now)  -- a refreshed record's last access
local first_status = loc_pos(1) + L_STATUS
local recs = {}  -- per position: the record if it serves, else false
local count = n
for i = 1, n do
  local key = sub(keys, i * 8 - 7, i * 8)
  local rec = call('HGET', buckets[i + 2], key)
  -- fast path: one location, status byte right after the header
  if rec and (mode == MODE_RAW or (blocked and serves(rec))
              or (not blocked and (byte(rec, first_status) == SERVING or find_status(rec, SERVING)))) then
    recs[i] = rec
  else
    recs[i] = false
    if mode == MODE_PREFIX and not (covered and byte(covered, i) == 49) then
      count = i - 1
      break
    end
  end
end

local lo, hi = 1, count
if mode == MODE_WINDOW then
  -- Right-most window of sw consecutive served keys (API.md: reverse roll).
  local base = n - sw
  lo, hi = 1, 0
  while base >= 0 do
    local failed = nil
    for o = 0, sw - 1 do
      local at = base + o + 1
      if not recs[at] and not (covered and byte(covered, at) == 49) then failed = o break end
    end
    if failed == nil then
      lo, hi = base + 1, base + sw
      break
    end
    base = base - (sw - failed)
  end
end

-- out alternates length prefixes and records: one concatenation at the end, none per key
local out, lengths = {}, {}
for i = 1, count do
  local rec = recs[i]
  if i < lo or i > hi or not rec then
    out[2 * i - 1] = '\0\0'
    out[2 * i] = ''
  else
    if mode ~= MODE_RAW then
      local atime = struct.unpack(H_LAST_ACCESS_S_FMT, rec, H_LAST_ACCESS_S)
      if atime <= stale then
        local lfu = byte(rec, H_LFU)
        if decay > 0 then
          lfu = lfu - math.floor((now - atime) / decay)
          if lfu < 0 then lfu = 0 end
        end
        if lfu < 255 then
          local base_val = lfu - LFU_INITIAL
          if base_val < 0 then base_val = 0 end
          if math.random() < 1.0 / (base_val * 10 + 1) then lfu = lfu + 1 end
        end
        -- one concatenation: the LFU counter follows the access time
        rec = sub(rec, 1, H_LAST_ACCESS_S - 1) .. stamp .. string.char(lfu) .. sub(rec, H_LFU + 1)
        call('HSET', buckets[i + 2], sub(keys, i * 8 - 7, i * 8), rec)
      end
    end
    -- records come in a few lengths (one per location count): pack each prefix once
    local length = #rec
    local prefix = lengths[length]
    if not prefix then
      prefix = struct.pack('>H', length)
      lengths[length] = prefix
    end
    out[2 * i - 1] = prefix
    out[2 * i] = rec
  end
end
if buckets ~= KEYS then return {table.concat(out), nbuckets} end
return table.concat(out)
