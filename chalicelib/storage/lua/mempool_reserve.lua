-- Reserve `count` ranges of `size` bytes, all or nothing (best fit), after freeing the
-- reservations left unbound longer than the ttl.
-- ARGV: capacity, count, block_bytes, reservation ttl (s), unbound owner tag.
-- Returns {RESERVE_GRANTED, address...} or {RESERVE_REFUSED, free bytes, largest free range}
-- (mempool.py ReserveResult).
local cap, count, size, ttl, tag = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
sync_capacity(cap)
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
-- Reservations of requests that died before prepare; a bounded batch per call.
for _, a in ipairs(redis.call('ZRANGEBYSCORE', PENDING, '-inf', string.format('%.6f', now - ttl), 'LIMIT', 0, 64)) do
  local member, s, l, owner = used_at(a)
  if member and string.sub(owner, 1, 1) == '-' then
    free_used(member, s, l, cap)
  else
    redis.call('ZREM', PENDING, a)
  end
end
local function refusal()
  local largest = redis.call('ZREVRANGE', FREE_LEN, 0, 0, 'WITHSCORES')
  return {RESERVE_REFUSED, tonumber(redis.call('HGET', META, 'free') or '0'), tonumber(largest[2] or '0')}
end
if tonumber(redis.call('HGET', META, 'free') or '0') < count * size then return refusal() end
local got = {}
local need = count
while need > 0 do
  local best = redis.call('ZRANGEBYSCORE', FREE_LEN, fmt(size), '+inf', 'LIMIT', 0, 1)
  if #best == 0 then break end
  local start = tonumber(best[1])
  local len = free_len(start)
  local take = math.min(need, math.floor(len / size))
  drop_free(start)
  if len > take * size then put_free(start + take * size, len - take * size) end
  for i = 0, take - 1 do
    got[#got + 1] = start + i * size
  end
  need = need - take
end
if need > 0 then
  -- Fragmented: undo. Ranges were maximal, so merging the pieces back restores them.
  for _, a in ipairs(got) do release(a, size, cap) end
  return refusal()
end
local out = {RESERVE_GRANTED}
for _, a in ipairs(got) do
  redis.call('ZADD', USED, fmt(a), fmt(a) .. ':' .. fmt(size) .. ':' .. tag)
  redis.call('ZADD', PENDING, string.format('%.6f', now), fmt(a))
  out[#out + 1] = a
end
redis.call('HINCRBY', META, 'free', fmt(-count * size))
redis.call('HINCRBY', META, 'used', fmt(count * size))
return out
