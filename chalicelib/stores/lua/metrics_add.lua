-- Add one container's metric changes to the service-wide hash, all or nothing (a retry
-- after a failure never counts a change twice).
-- KEYS: [1] metrics hash.
-- ARGV: triples of op ('i' add an integer, 'f' add a float, 's' set), field, value.
local key = KEYS[1]
for i = 1, #ARGV, 3 do
  local op, field, value = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if op == 'i' then
    redis.call('HINCRBY', key, field, value)
  elseif op == 'f' then
    redis.call('HINCRBYFLOAT', key, field, value)
  else
    redis.call('HSET', key, field, value)
  end
end
return #ARGV / 3
