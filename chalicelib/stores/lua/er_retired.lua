-- Forgets retired generation tokens once their cleanup pass is done, and frees their slots:
-- the pass cleared every bit of them (reporters.py).
-- KEYS: reporter state, the instance's free-slot zset, the instance's reporter view.
-- ARGV: the tokens the pass cleaned (' '), rid
-- Returns the tokens still retired
local state = hgetall_table(KEYS[1])
if not state then return '' end
local done = er_set(ARGV[1])
local left, fields, freed = {}, {}, {}
for w in string.gmatch(state.ret or '', '%S+') do
  if not done[w] then left[#left + 1] = w end
end
er_each_slot(state, function(slot, version, sig)
  if done[version] then
    fields[#fields + 1] = 'slot:' .. version .. ':' .. sig
    freed[#freed + 1] = slot
    freed[#freed + 1] = slot
  end
end)
if #fields > 0 then
  redis.call('HDEL', KEYS[1], unpack(fields))
  redis.call('ZADD', KEYS[2], unpack(freed))
end
local text = table.concat(left, ' ')
redis.call('HSET', KEYS[1], 'ret', text)
state.ret = text
for _, field in ipairs(fields) do state[field] = nil end
er_write_view(KEYS[3], ARGV[2], state)
return text
