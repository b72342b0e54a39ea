-- finishWriteCache (and expiry): WRITING(session) -> SERVING for successful blocks,
-- -> DELETING for the rest; the session is gone afterwards, so a late finish fails.
-- KEYS: [1] session deadlines, [2] session record, [3] usage, [4] storage table,
--       [5] pending deletions (mark.lua), [6] open sessions per caller (start.lua: a
--       session naming its caller counts there).
-- ARGV: [1] now (ms), [2] session id, [3] success flag per session key ('1'/'0'),
--       [4] '1' to fail the whole session whatever its deadline (the reaper),
--       [5] the session's key blob as the caller read it, [6] bucket prefix,
--       [7] block size per spec group (I6 each), [8] the finishing instance's id: a
--       session is finished only by the instance that started it, [9] the pending
--       deadline (s) of the locations it turns DELETING, [10] when a tiered Mark goes
--       (CLEAR_NEXT_WRITE, CLEAR_FULL_BLOCK; '': never), [11] spec group coverage
--       (start.lua ARG.covers), [12] the number of spec groups.
-- Returns {status, victims, uncommitted, marks, deleting charge...}: status FINISH_FINISHED,
-- FINISH_UNKNOWN (no such session), FINISH_EXPIRED (every block failed), FINISH_CHANGED
-- (the session changed under the caller). Victims are the locations now DELETING, as
-- VICTIM_FMT descriptors; uncommitted, one byte per session key, '1' where the caller
-- said success but the location was no longer WRITING (a removeCache or trim took it
-- meanwhile): it will not be served; the charge is prelude's deleting_charge.
-- A tiered Copy's session (migrate_begin.lua) names each block's source location in its
-- 'm' field: a target turns SERVING only while that source is still SERVING (the bytes
-- copied are the block's), else it fails like a reported failure, marked uncommitted.
-- A location turning SERVING on its record's Mark target clears the Mark (UPSTREAM_V2
-- §2.11, a Copy's target too): with CLEAR_NEXT_WRITE always, with CLEAR_FULL_BLOCK only
-- when it holds every spec of each other SERVING location of the block. Marks is
-- 'consumed,marks after' (the instance's 'mk'; 0 when none was consumed).
-- A demote's session (migrate_begin.lua ARGV[21]) gives its 'v' bytes back off the usage
-- hash's 'mt:<type>' here, whatever the outcome (finished, failed, expired by the reaper).
local deadlines, session = KEYS[1], KEYS[2]
local now_ms, sid, success, force, expected = tonumber(ARGV[1]), ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local bprefix = ARGV[6]
local charge = deleting_charge(KEYS[4], ARGV[7])
local s = redis.call('HMGET', session, 'd', 'k', 'i', 'p', 'm', 'v')
if not s[1] or (s[3] and s[3] ~= ARGV[8]) then return {FINISH_UNKNOWN, '', ''} end
if s[2] ~= expected then return {FINISH_CHANGED, '', ''} end
local status = FINISH_FINISHED
if force == '1' or now_ms > tonumber(s[1]) then
  status = FINISH_EXPIRED
  success = ''
end
local blob = s[2]
local nbuckets = bucket_count(meta_of(bprefix))
local victims = {}
local uncommitted = {}
local clear, covers, ngroups = ARGV[10], ARGV[11], tonumber(ARGV[12])
local consumed = 0
-- Whether location i (of spec group sg) holds every spec of the block's other SERVING locations.
local function full_block(rec, i, sg)
  for l = 1, location_count(rec) do
    local st, _, lsg = loc_at(rec, l)
    if l ~= i and st == SERVING and not covers_group(covers, ngroups, lsg, sg) then return false end
  end
  return true
end
for j = 1, #blob / SESSION_ENTRY_LEN do
  uncommitted[j] = string.sub(success, j, j) == '1' and '1' or '0'
  local key, loc = struct.unpack(SESSION_ENTRY_FMT, blob, (j - 1) * SESSION_ENTRY_LEN + 1)
  local bucket = bucket_of(bprefix, nbuckets, key)
  local rec = redis.call('HGET', bucket, key)
  if rec then
    local i = find_loc(rec, loc)
    if i then
      local st, sidx, sg, id, group, slot = loc_at(rec, i)
      if st == WRITING then
        local ok = string.sub(success, j, j) == '1'
        if ok and s[5] then
          local _, source = struct.unpack(SESSION_ENTRY_FMT, s[5], (j - 1) * SESSION_ENTRY_LEN + 1)
          local at = find_loc(rec, source)
          ok = at ~= nil and loc_status(rec, at) == SERVING
        end
        uncommitted[j] = (string.sub(success, j, j) == '1' and not ok) and '1' or '0'
        if ok then
          rec = set_loc_status(rec, i, SERVING)
          if #clear > 0 and read_mark(rec) == sidx and (clear == CLEAR_NEXT_WRITE or full_block(rec, i, sg)) then
            rec = clear_mark(rec)
            consumed = consumed + 1
          end
          redis.call('HSET', bucket, key, rec)
        else
          rec = unlink_from_parent(bprefix, nbuckets, set_loc_status(rec, i, DELETING))
          redis.call('HSET', bucket, key, stamp_deleting(rec, math.floor(now_ms / 1000)))
          victims[#victims + 1] = struct.pack(VICTIM_FMT, key, id, sidx, sg, group, slot)
          redis.call('ZADD', KEYS[5], ARGV[9], struct.pack(SESSION_ENTRY_FMT, key, id))
          charge.add(sidx, sg, rec)
        end
      end
    end
  end
end
redis.call('DEL', session)
redis.call('ZREM', deadlines, sid)
if s[4] and redis.call('HINCRBY', KEYS[6], s[4], -1) <= 0 then redis.call('HDEL', KEYS[6], s[4]) end
if s[6] then
  local vtype, vbytes = string.match(s[6], '^(.*):(%d+)$')
  local field = 'mt:' .. vtype
  if redis.call('HINCRBY', KEYS[3], field, -tonumber(vbytes)) <= 0 then redis.call('HDEL', KEYS[3], field) end
end
local marks = 0
if consumed > 0 then marks = redis.call('HINCRBY', KEYS[3], 'mk', -consumed) end
local out = charge.flush(KEYS[3])
table.insert(out, 1, consumed .. ',' .. marks)
table.insert(out, 1, table.concat(uncommitted))
table.insert(out, 1, table.concat(victims))
table.insert(out, 1, status)
return out
