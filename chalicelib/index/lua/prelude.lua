-- Shared by every KVCM index script (prepended at load time).
--
-- A block record (hash field = 8-byte big-endian block key, value = this record):
--   header (23 bytes) '>Bc8HI4BI6B':
--     flags (bit 0: has parent; bit 1: adopted, see start.lua "Child counts"), parent
--     key, child count, last access (s), LFU counter, write time (ms), location count
--   location (16 bytes each) '>BBBI5I6H':
--     status, storage index, spec group index, location id, group id, slot
--   an adopted record's adopter (5 bytes '>I5') after its locations
local HDR_FMT = '>Bc8HI4BI6B'
local LOC_FMT = '>BBBI5I6H'
local HDR_LEN = 23
local LOC_LEN = 16
local WRITING, SERVING, DELETING = 1, 2, 3

local function header(rec)
  local flags, parent, children, atime, lfu, wtime, nloc = struct.unpack(HDR_FMT, rec)
  return flags, parent, children, atime, lfu, wtime, nloc
end

local function loc_at(rec, i)
  -- i is 1-based
  return struct.unpack(LOC_FMT, rec, HDR_LEN + (i - 1) * LOC_LEN + 1)
end

local function set_loc_status(rec, i, status)
  local pos = HDR_LEN + (i - 1) * LOC_LEN + 1
  return string.sub(rec, 1, pos - 1) .. struct.pack('>B', status) .. string.sub(rec, pos + 1)
end

-- A location turning DELETING stamps the record's access time (unused once nothing
-- serves it): capacity/stranded.py finds deletions that never finished by it.
local function stamp_deleting(rec, now_s)
  return string.sub(rec, 1, 11) .. struct.pack('>I4', now_s) .. string.sub(rec, 16)
end

local function remove_loc(rec, i)
  local pos = HDR_LEN + (i - 1) * LOC_LEN + 1
  local nloc = struct.unpack('>B', rec, HDR_LEN)
  local head = string.sub(rec, 1, HDR_LEN - 1) .. struct.pack('>B', nloc - 1)
  return head .. string.sub(rec, HDR_LEN + 1, pos - 1) .. string.sub(rec, pos + LOC_LEN)
end

local function set_children(rec, delta)
  local children = struct.unpack('>H', rec, 10)
  children = children + delta
  if children < 0 then children = 0 end
  if children > 65535 then children = 65535 end
  return string.sub(rec, 1, 9) .. struct.pack('>H', children) .. string.sub(rec, 12)
end

-- The index of the first location with `status`, or nil.
local function find_status(rec, status)
  local nloc = struct.unpack('>B', rec, HDR_LEN)
  for i = 1, nloc do
    if struct.unpack('>B', rec, HDR_LEN + (i - 1) * LOC_LEN + 1) == status then return i end
  end
  return nil
end

-- The index of the location with id `loc_id`, or nil.
local function find_loc(rec, loc_id)
  local nloc = struct.unpack('>B', rec, HDR_LEN)
  for i = 1, nloc do
    local _, _, _, id = loc_at(rec, i)
    if id == loc_id then return i end
  end
  return nil
end

local function field(blob, i)
  return string.sub(blob, (i - 1) * 8 + 1, i * 8)
end

-- Bucket key of a block key. Scripts declare the instance's fixed keys and derive bucket
-- keys here: every bucket shares the declared keys' hash tag, hence their cluster slot,
-- and the caller is spared packing one argument per block. The bucket count is a power
-- of two of at most 2^24 (MAX_BUCKET_BITS), so the key's low three bytes decide it.
local function bucket_index(nbuckets, key)
  local a, b, c = string.byte(key, 6, 8)
  return ((a * 256 + b) * 256 + c) % nbuckets
end

local function bucket_of(bucket_prefix, nbuckets, key)
  return bucket_prefix .. string.format('%x', bucket_index(nbuckets, key))
end

-- The occupied-bucket set (integer members: Valkey keeps a small one as an intset) lets
-- scans, sampling and removal cost what an instance holds, not the buckets it was sized
-- for. start.lua adds a bucket when it writes a record there; drop.lua takes it out
-- once the bucket hash is gone. Members are added in chunks: unpack() has a stack limit.
local function sadd_all(set, members)
  for i = 1, #members, 4096 do
    redis.call('SADD', set, unpack(members, i, math.min(i + 4095, #members)))
  end
end

-- Victim descriptor (23 bytes): key, location id, storage index, spec group, group id, slot.
local VICTIM_FMT = '>c8I5BBI6H'
local VICTIM_LEN = 23

-- A record whose last live location turned DELETING stops counting as its parent's
-- child at once (it never serves again), so leaf-first reclaim sees the parent as a leaf
-- now, not once the deletion has run. Flags bit 2 ("unlinked") says so, and drop.lua does
-- not take it off the parent a second time. Only a record linked to the parent's current
-- record counts there (start.lua, "Child counts"). Returns the record with the flag set.
local UNLINKED = 4
local function unlink_from_parent(bprefix, nbuckets, rec)
  local flags, parent = struct.unpack('>Bc8', rec)
  if flags % 2 == 0 or flags % 8 >= UNLINKED or find_status(rec, SERVING) or find_status(rec, WRITING) then
    return rec
  end
  local nloc = struct.unpack('>B', rec, HDR_LEN)
  local seq = struct.unpack('>I5', rec, HDR_LEN + 4)
  local pbucket = bucket_of(bprefix, nbuckets, parent)
  local prec = redis.call('HGET', pbucket, parent)
  if prec and struct.unpack('>B', prec, HDR_LEN) > 0 then
    local pseq = struct.unpack('>I5', prec, HDR_LEN + 4)
    local linked
    if flags % 4 < 2 then
      linked = pseq < seq
    else  -- adopted: the record's tail names its adopter
      linked = pseq == struct.unpack('>I5', rec, HDR_LEN + nloc * LOC_LEN + 1)
    end
    if linked then redis.call('HSET', pbucket, parent, set_children(prec, -1)) end
  end
  return string.char(flags + UNLINKED) .. string.sub(rec, 2)
end

-- Charging locations that turn DELETING to the usage hash's deleting counters ('d',
-- 'dt:<type>', 'dk'; start.lua's quotas exclude them, drop.lua releases them). A
-- charge is summed per call and applied once; `flush` returns it for the caller to
-- add to the group's counters as {bytes, keys, type, bytes, ...}.
local function deleting_charge(stab, sizes)
  local charge = {bytes = 0, keys = 0, by_type = {}, types = {}}
  function charge.add(sidx, sg)
    local stype = charge.types[sidx]
    if not stype then
      stype = redis.call('HGET', stab, 't' .. sidx) or ''
      charge.types[sidx] = stype
    end
    local size = struct.unpack('>I6', sizes, sg * 6 + 1)
    charge.bytes = charge.bytes + size
    charge.keys = charge.keys + 1
    charge.by_type[stype] = (charge.by_type[stype] or 0) + size
  end
  function charge.flush(usage)
    local out = {charge.bytes, charge.keys}
    if charge.keys > 0 then
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
