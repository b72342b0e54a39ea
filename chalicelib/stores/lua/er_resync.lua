-- Retires one reporter's current generation, atomically with its other state (reporters.py
-- drop_legacy_layout): its next report then says a snapshot is required.
-- KEYS: reporter state, the instance's reporter view. ARGV: rid. Returns 1 when a generation
-- was retired.
local gen, ret = unpack(redis.call('HMGET', KEYS[1], 'gen', 'ret'))
if not gen or gen == '' then return 0 end
local state = {gen = gen, ret = ret or ''}
er_retire(state)
redis.call('HSET', KEYS[1], 'gen', state.gen, 'com', state.com, 'strict', state.strict, 'ret', state.ret)
er_write_view(KEYS[2], ARGV[1], hgetall_table(KEYS[1]))
return 1
