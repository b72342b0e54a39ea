-- Forgets retired generation tokens once their cleanup pass is done (reporters.py).
-- KEYS: reporter state. ARGV: the tokens the pass cleaned (' ')
-- Returns the tokens still retired
local ret = redis.call('HGET', KEYS[1], 'ret')
if not ret then return '' end
local done = er_set(ARGV[1])
local left = {}
for w in string.gmatch(ret, '%S+') do
  if not done[w] then left[#left + 1] = w end
end
local text = table.concat(left, ' ')
redis.call('HSET', KEYS[1], 'ret', text)
return text
