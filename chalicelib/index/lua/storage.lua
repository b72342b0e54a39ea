-- The index of a storage in a sharded instance's storage table, assigned when absent
-- (docs/instance-sharding.md): shard 0 assigns it here, the caller copies the entry to
-- the other shards before their start.lua runs, so an index names one storage in every
-- shard (start.lua assigns it itself in an instance of one shard).
-- KEYS: [1] meta, [2] storage table (shard 0's).
-- ARGV: [1] storage name, [2] storage type.
-- Returns {storages assigned, index}; index 0 when the instance has 255 storages, the
-- most a location addresses (the caller copies the count too, so the other shards'
-- start.lua refuses such a write as shard 0 would).
local meta, stab, sname, stype = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local sidx = redis.call('HGET', stab, 'n:' .. sname)
local count = tonumber(redis.call('HGET', meta, 'storages') or 0)
if sidx then return {count, tonumber(sidx)} end
if count >= 255 then return {count, 0} end
sidx = redis.call('HINCRBY', meta, 'storages', 1)
redis.call('HSET', stab, 'n:' .. sname, sidx, '#' .. sidx, sname, 't' .. sidx, stype)
return {sidx, sidx}
