-- Compare-and-delete: remove DELETING locations whose id still matches, release their
-- usage, unlink them from their parent, and hand packed groups whose last block is gone
-- to the orphan set (their files are deleted next, retried until done).
-- KEYS: [1] usage, [2] storage table, [3] group refcounts, [4] orphan groups.
-- ARGV: [1] victims blob (VICTIM_FMT), [2] block size per spec group (I6 each),
--       [3] bucket key prefix, [4] bucket count.
-- Returns {locations dropped, orphan groups blob ('>BI6': storage index, group id)}.
local usage, stab, groups, orphans = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local victims, sizes = ARGV[1], ARGV[2]
local bucket_prefix, nbuckets = ARGV[3], tonumber(ARGV[4])
local dropped = 0
local released = {}
local storage_info = {}
local function storage(sidx)
  local info = storage_info[sidx]
  if not info then
    local r = redis.call('HMGET', stab, '#' .. sidx, 't' .. sidx)
    info = {r[1] or '', r[2] or ''}
    storage_info[sidx] = info
  end
  return info[1], info[2]
end

for v = 1, #victims / VICTIM_LEN do
  local key, loc, sidx, sg, group, slot = struct.unpack(VICTIM_FMT, victims, (v - 1) * VICTIM_LEN + 1)
  local bucket = bucket_of(bucket_prefix, nbuckets, key)
  local rec = redis.call('HGET', bucket, key)
  local i = rec and find_loc(rec, loc)
  if i and struct.unpack('>B', rec, HDR_LEN + (i - 1) * LOC_LEN + 1) == DELETING then
    local size = struct.unpack('>I6', sizes, sg * 6 + 1)
    rec = remove_loc(rec, i)
    local flags, parent = struct.unpack('>Bc8', rec)
    local sname, stype = storage(sidx)
    redis.call('HINCRBY', usage, 'bytes', -size)
    redis.call('HINCRBY', usage, 't:' .. stype, -size)
    redis.call('HINCRBY', usage, 's:' .. sname, -size)
    if struct.unpack('>B', rec, HDR_LEN) == 0 then
      redis.call('HDEL', bucket, key)
      redis.call('HINCRBY', usage, 'keys', -1)
      if flags % 2 == 1 then
        local pbucket = bucket_of(bucket_prefix, nbuckets, parent)
        local prec = redis.call('HGET', pbucket, parent)
        if prec then redis.call('HSET', pbucket, parent, set_children(prec, -1)) end
      end
    else
      redis.call('HSET', bucket, key, rec)
    end
    local gfield = struct.pack('>BI6', sidx, group)
    if redis.call('HEXISTS', groups, gfield) == 1 then
      if redis.call('HINCRBY', groups, gfield, -1) <= 0 then
        redis.call('HDEL', groups, gfield)
        redis.call('SADD', orphans, gfield)
        released[#released + 1] = gfield
      end
    end
    dropped = dropped + 1
  end
end
return {dropped, table.concat(released)}
