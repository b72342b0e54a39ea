-- Hold a tiered Copy in quarantine (docs/tiered-storage.md "Copy quarantine"): its copy
-- timed out, so its writer may still write the targets. The session (one shard's part of
-- it) stays open with its WRITING targets (not served, still counted, skipped by the GC as
-- every open session's), its guard state QUARANTINED and the evidence kept beside it; its
-- deadline becomes the release time (the writer's hard timeout passed), so the reaper finds
-- it due then and releases it. finish.lua closes it only when named its guard state.
-- KEYS: [1] session deadlines, [2] session record.
-- ARGV: [1] session id, [2] instance id (the session's owner), [3] release time (ms),
--       [4] now (µs), [5] last error, [6] backend task ids ('\n' between), [7] source
--       storage name, [8] target storage name.
-- Returns {HOLD_HELD, entries, quarantined at (µs)} held now, {HOLD_HELD_ALREADY, entries,
-- quarantined at} held already (a step run again changes nothing), or {HOLD_UNKNOWN} (no
-- such open session: finished, or expired and reaped).
local deadlines, session = KEYS[1], KEYS[2]
local s = redis.call('HMGET', session, 'd', 'k', 'i', 'q', 'qc')
if not s[1] or (s[3] and s[3] ~= ARGV[2]) then return {HOLD_UNKNOWN} end
if s[4] then return {HOLD_HELD_ALREADY, s[2], s[5]} end
redis.call('HSET', session, 'q', GUARD_QUARANTINED, 'qc', ARGV[4], 'qu', ARGV[4], 'qe', ARGV[5], 'qt', ARGV[6],
           'qs', ARGV[7], 'qn', ARGV[8], 'd', ARGV[3])
redis.call('ZADD', deadlines, ARGV[3], ARGV[1])
return {HOLD_HELD, s[2], ARGV[4]}
