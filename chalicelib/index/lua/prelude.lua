-- Shared by every KVCM index script (prepended at load time, after the constants that
-- chalicelib/index/layout.py generates: HDR_*, LOC_*, H_<field>, L_<field>, the statuses,
-- flags and reply codes; docs/record-layout.md).
--
-- A block record (hash field = 8-byte big-endian block key, value = this record):
--   header HDR_FMT: flags (HAS_PARENT; ADOPTED, see start.lua "Child counts"; UNLINKED),
--     parent key, child count, last access (s), LFU counter, write time (ms), location count
--   location LOC_FMT each: status, storage index, spec group index, location id, group id, slot
--   an adopted record's adopter (ADOPTER_FMT) after its locations
-- H_<field> is a header field's position in a record; L_<field> a location field's offset
-- from its location's position, loc_pos(i).
local byte, sub = string.byte, string.sub

local function has_flag(flags, flag)
  return bit.band(flags, flag) ~= 0
end

-- Position of the first byte of location i (1-based); loc_pos(count + 1) is just past them.
local function loc_pos(i)
  return HDR_LEN + (i - 1) * LOC_LEN + 1
end

local function location_count(rec)
  return byte(rec, H_LOCATION_COUNT)
end

local function loc_at(rec, i)
  return struct.unpack(LOC_FMT, rec, loc_pos(i))
end

local function loc_status(rec, i)
  return byte(rec, loc_pos(i) + L_STATUS)
end

-- `rec` with the bytes at `pos` replaced by struct.pack(fmt, ...).
local function put(rec, pos, fmt, ...)
  local value = struct.pack(fmt, ...)
  return sub(rec, 1, pos - 1) .. value .. sub(rec, pos + #value)
end

local function set_loc_status(rec, i, status)
  return put(rec, loc_pos(i) + L_STATUS, L_STATUS_FMT, status)
end

-- A location turning DELETING stamps the record's access time (unused once nothing
-- serves it): the record shows when it last turned DELETING.
local function stamp_deleting(rec, now_s)
  return put(rec, H_LAST_ACCESS_S, H_LAST_ACCESS_S_FMT, now_s)
end

local function remove_loc(rec, i)
  local pos = loc_pos(i)
  rec = put(rec, H_LOCATION_COUNT, H_LOCATION_COUNT_FMT, location_count(rec) - 1)
  return sub(rec, 1, pos - 1) .. sub(rec, pos + LOC_LEN)
end

local function set_children(rec, delta)
  local children = struct.unpack(H_CHILDREN_FMT, rec, H_CHILDREN) + delta
  if children < 0 then children = 0 end
  if children > MAX_CHILDREN then children = MAX_CHILDREN end
  return put(rec, H_CHILDREN, H_CHILDREN_FMT, children)
end

-- A record's sequence number: the id of its location (start.lua, "Child counts").
local function sequence(rec)
  return (struct.unpack(L_LOCATION_ID_FMT, rec, loc_pos(1) + L_LOCATION_ID))
end

-- The sequence number of an adopted record's adopter (its tail, after its locations).
local function adopter(rec)
  return (struct.unpack(ADOPTER_FMT, rec, loc_pos(location_count(rec) + 1)))
end

-- Whether a location of spec group `held` holds every spec of spec group `wanted`
-- (`covers` as start.lua's ARG.covers: '' when every location covers every group).
local function covers_group(covers, ngroups, wanted, held)
  return #covers == 0 or byte(covers, wanted * ngroups + held + 1) == 49
end

-- Whether storage `sidx` holds a SERVING or WRITING location of `rec` covering spec group `sg`.
local function live_on(rec, sidx, sg, covers, ngroups)
  for l = 1, location_count(rec) do
    local st, lsidx, lsg = loc_at(rec, l)
    if lsidx == sidx and st ~= DELETING and covers_group(covers, ngroups, sg, lsg) then return true end
  end
  return false
end

-- Tiered Mark (flag MARKED, TIER_MARK_FMT: target storage index, expiry ms): the record's
-- last bytes, after its locations and its adopter if any. A record without one has none.
local function mark_pos(rec)
  local pos = loc_pos(location_count(rec) + 1)
  if has_flag(byte(rec, H_FLAGS), ADOPTED) then pos = pos + ADOPTER_LEN end
  return pos
end

-- A record's Mark: its target's storage index and expiry (ms); nil without one, false for
-- a flag whose bytes are not a mark (malformed).
local function read_mark(rec)
  if not has_flag(byte(rec, H_FLAGS), MARKED) then return nil end
  local pos = mark_pos(rec)
  if #rec ~= pos + TIER_MARK_LEN - 1 then return false end
  local sidx, expiry = struct.unpack(TIER_MARK_FMT, rec, pos)
  if sidx == 0 then return false end
  return sidx, expiry
end

-- A record's Mark bytes ('' without one), to carry over when its tail is rebuilt.
local function mark_tail(rec)
  if not has_flag(byte(rec, H_FLAGS), MARKED) then return '' end
  return sub(rec, mark_pos(rec))
end

-- `rec` without its Mark (flag and bytes).
local function clear_mark(rec)
  local pos = mark_pos(rec)
  return sub(put(rec, H_FLAGS, H_FLAGS_FMT, bit.band(byte(rec, H_FLAGS), bit.bnot(MARKED))), 1, pos - 1)
end

-- `rec` marked for storage `sidx` until `expiry_ms` (an earlier Mark replaced).
local function set_mark(rec, sidx, expiry_ms)
  if has_flag(byte(rec, H_FLAGS), MARKED) then rec = clear_mark(rec) end
  return put(rec, H_FLAGS, H_FLAGS_FMT, bit.bor(byte(rec, H_FLAGS), MARKED)) .. struct.pack(TIER_MARK_FMT, sidx, expiry_ms)
end

-- Whether a record with `flags` and sequence number `seq` (`rec`, for an adopted one's
-- adopter tail) is linked to `prec`, its parent key's current record, which counts it
-- then (start.lua, "Child counts").
local function linked_to(prec, flags, seq, rec)
  if location_count(prec) == 0 then return false end
  if has_flag(flags, ADOPTED) then return sequence(prec) == adopter(rec) end
  return sequence(prec) < seq
end

-- The index of the first location with `status`, or nil.
local function find_status(rec, status)
  for i = 1, location_count(rec) do
    if loc_status(rec, i) == status then return i end
  end
  return nil
end

-- The index of the location with id `loc_id`, or nil.
local function find_loc(rec, loc_id)
  for i = 1, location_count(rec) do
    if struct.unpack(L_LOCATION_ID_FMT, rec, loc_pos(i) + L_LOCATION_ID) == loc_id then return i end
  end
  return nil
end

local function field(blob, i)
  return string.sub(blob, (i - 1) * 8 + 1, i * 8)
end

-- Bucket key of a block key. Scripts declare the instance's fixed keys and derive bucket
-- keys here: every bucket shares the declared keys' hash tag, hence their cluster slot,
-- and the caller is spared packing one argument per block.
--
-- Buckets grow with the records (linear hashing, docs/record-layout.md "Buckets"): an
-- instance of n buckets, 2^L <= n < 2^(L+1), puts a key of hash h (its low
-- BUCKET_HASH_BITS bits) in bucket h mod 2^(L+1), or h mod 2^L when that bucket is not
-- split yet (>= n). Meta field 'n' holds n; a key space without it (written before
-- buckets grew) has the 2^bits buckets it was registered with, its first level.
local level_sizes = {}

-- 2^L, the largest power of two at most n.
local function level_size(nbuckets)
  local low = level_sizes[nbuckets]
  if not low then
    low = 1
    while low * 2 <= nbuckets do low = low * 2 end
    level_sizes[nbuckets] = low
  end
  return low
end

local function key_hash(key)
  local a, b, c = string.byte(key, 6, 8)
  return (a * 256 + b) * 256 + c
end

local function bucket_index(nbuckets, key)
  local low = level_size(nbuckets)
  local h = key_hash(key)
  local i = h % (2 * low)
  if i >= nbuckets then i = h % low end
  return i
end

local function bucket_of(bucket_prefix, nbuckets, key)
  return bucket_prefix .. string.format('%x', bucket_index(nbuckets, key))
end

-- The instance's meta hash, from its bucket prefix ('<tag>:b:' -> '<tag>:m'), for scripts
-- that do not declare it: same hash tag, same slot.
local function meta_of(bucket_prefix)
  return sub(bucket_prefix, 1, -3) .. 'm'
end

-- The instance's bucket count now (read in the script that uses it: a split happens only
-- inside a script, so the count a script reads addresses every key it touches).
local function bucket_count(meta)
  local m = redis.call('HMGET', meta, 'n', 'bits')
  return tonumber(m[1]) or 2 ^ tonumber(m[2] or 0)
end

-- `command key items...`, in chunks: unpack() has a stack limit.
local function call_chunked(command, key, items)
  for i = 1, #items, 4096 do
    redis.call(command, key, unpack(items, i, math.min(i + 4095, #items)))
  end
end

-- Split buckets while the instance holds more than `per_bucket` records per bucket, at
-- most MAX_SPLITS_PER_CALL of them (a key space registered with too few buckets catches
-- up over several calls, no call moving more than that many buckets' records). Each
-- split moves the records of bucket n - 2^L whose hash says bucket n there, then n grows
-- by one; the occupied set follows. Returns the bucket count after.
local function grow_buckets(meta, bucket_prefix, occupied, records, per_bucket)
  local nbuckets = bucket_count(meta)
  local splits = 0
  while records > per_bucket * nbuckets and nbuckets < MAX_BUCKETS and splits < MAX_SPLITS_PER_CALL do
    local low = level_size(nbuckets)
    local from = nbuckets - low
    local source = bucket_prefix .. string.format('%x', from)
    local all = redis.call('HGETALL', source)
    local moved, names = {}, {}
    for j = 1, #all, 2 do
      if key_hash(all[j]) % (2 * low) == nbuckets then
        moved[#moved + 1] = all[j]
        moved[#moved + 1] = all[j + 1]
        names[#names + 1] = all[j]
      end
    end
    if #names > 0 then
      call_chunked('HSET', bucket_prefix .. string.format('%x', nbuckets), moved)
      call_chunked('HDEL', source, names)
      redis.call('SADD', occupied, nbuckets)
      if #moved == #all then redis.call('SREM', occupied, from) end
    end
    nbuckets, splits = nbuckets + 1, splits + 1
  end
  if splits > 0 then redis.call('HSET', meta, 'n', nbuckets) end
  return nbuckets
end

-- The occupied-bucket set (integer members: Valkey keeps a small one as an intset) lets
-- scans, sampling and removal cost what an instance holds, not the buckets it was sized
-- for. start.lua adds a bucket when it writes a record there; drop.lua takes it out
-- once the bucket hash is gone; a split moves it (grow_buckets).

-- A record whose last live location turned DELETING stops counting as its parent's
-- child at once (it never serves again), so leaf-first reclaim sees the parent as a leaf
-- now, not once the deletion has run. Flag UNLINKED says so, and drop.lua does
-- not take it off the parent a second time. Only a record linked to the parent's current
-- record counts there (start.lua, "Child counts"). Returns the record with the flag set.
local function unlink_from_parent(bprefix, nbuckets, rec)
  local flags = byte(rec, H_FLAGS)
  if not has_flag(flags, HAS_PARENT) or has_flag(flags, UNLINKED) or find_status(rec, SERVING)
      or find_status(rec, WRITING) then
    return rec
  end
  local parent = struct.unpack(H_PARENT_FMT, rec, H_PARENT)
  local pbucket = bucket_of(bprefix, nbuckets, parent)
  local prec = redis.call('HGET', pbucket, parent)
  if prec and linked_to(prec, flags, sequence(rec), rec) then
    redis.call('HSET', pbucket, parent, set_children(prec, -1))
  end
  return put(rec, H_FLAGS, H_FLAGS_FMT, bit.bor(flags, UNLINKED))
end

-- Whether a record still has a location that serves or is being written.
local function has_live(rec)
  return find_status(rec, SERVING) ~= nil or find_status(rec, WRITING) ~= nil
end

-- Take freed bytes (summed per storage type and per storage) off the usage hash, and with
-- `deleting` off its DELETING part too ('d', 'dt:<type>'). Appends type, bytes pairs to
-- `out`, for the caller's group counters (drop.lua, release.lua).
local function release_bytes(usage, bytes, by_type, by_storage, deleting, out)
  redis.call('HINCRBY', usage, 'bytes', -bytes)
  if deleting then redis.call('HINCRBY', usage, 'd', -bytes) end
  for stype, size in pairs(by_type) do
    redis.call('HINCRBY', usage, 't:' .. stype, -size)
    if deleting then redis.call('HINCRBY', usage, 'dt:' .. stype, -size) end
    out[#out + 1] = stype
    out[#out + 1] = size
  end
  for sname, size in pairs(by_storage) do redis.call('HINCRBY', usage, 's:' .. sname, -size) end
end

-- Charging locations that turn DELETING to the usage hash's deleting counters ('d',
-- 'dt:<type>', 'dk'; start.lua's quotas exclude them, drop.lua releases them). A
-- charge is summed per call and applied once; `flush` returns it for the caller to
-- add to the group's counters as {bytes, keys, type, bytes, ...}. `rec` is the record
-- after the change: its key counts as DELETING ('dk') only once no location of it is
-- live, as drop.lua releases a key only with its last location (a record may hold
-- replicas: start.lua).
local function deleting_charge(stab, sizes)
  local charge = {bytes = 0, keys = 0, by_type = {}, types = {}}
  function charge.add(sidx, sg, rec)
    local stype = charge.types[sidx]
    if not stype then
      stype = redis.call('HGET', stab, 't' .. sidx) or ''
      charge.types[sidx] = stype
    end
    local size = struct.unpack('>I6', sizes, sg * 6 + 1)
    charge.bytes = charge.bytes + size
    if not has_live(rec) then charge.keys = charge.keys + 1 end
    charge.by_type[stype] = (charge.by_type[stype] or 0) + size
  end
  function charge.flush(usage)
    local out = {charge.bytes, charge.keys}
    if charge.bytes > 0 or charge.keys > 0 then
      redis.call('HINCRBY', usage, 'd', charge.bytes)
      redis.call('HINCRBY', usage, 'dk', charge.keys)
      for stype, size in pairs(charge.by_type) do
        redis.call('HINCRBY', usage, 'dt:' .. stype, size)
        out[#out + 1] = stype
        out[#out + 1] = size
      end
    end
    return out
  end
  return charge
end
