-- Shared by the memory-pool allocator scripts (prepended at load time; storage/mempool.py
-- describes the allocator and its keys).
-- KEYS: [1] free ranges by address, [2] free ranges by length, [3] used ranges,
--       [4] unbound reservations, [5] meta.
--
-- Lua numbers are doubles: exact for integers below 2**53, which bounds capacity (2**48).
-- Every number handed to redis.call goes through fmt(): the default number-to-string
-- conversion prints "%.14g" and would corrupt large addresses.
local FREE_ADDR, FREE_LEN, USED, PENDING, META = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]

local function fmt(n) return string.format('%d', n) end

local function free_len(start)
  local v = redis.call('ZSCORE', FREE_LEN, fmt(start))
  if v then return tonumber(v) end
  return nil
end

local function put_free(start, len)
  redis.call('ZADD', FREE_ADDR, fmt(start), fmt(start))
  redis.call('ZADD', FREE_LEN, fmt(len), fmt(start))
end

local function drop_free(start)
  redis.call('ZREM', FREE_ADDR, fmt(start))
  redis.call('ZREM', FREE_LEN, fmt(start))
end

local function parse_used(member)
  local s, l, owner = string.match(member, '^(%d+):(%d+):(.+)$')
  return tonumber(s), tonumber(l), owner
end

-- The allocation starting at address a (a decimal string): member, start, length, owner.
local function used_at(a)
  local hit = redis.call('ZRANGEBYSCORE', USED, a, a, 'LIMIT', 0, 1)
  if #hit == 0 then return nil end
  local s, l, owner = parse_used(hit[1])
  return hit[1], s, l, owner
end

-- Put [start, start+len) on the free list, merged with touching free ranges. Bytes at or
-- past cap are dropped. Returns the bytes added.
local function release(start, len, cap)
  if start + len > cap then len = cap - start end
  if len <= 0 then return 0 end
  local added = len
  local prev = redis.call('ZREVRANGEBYSCORE', FREE_ADDR, '(' .. fmt(start), '-inf', 'LIMIT', 0, 1)
  if #prev > 0 then
    local ps = tonumber(prev[1])
    local pl = free_len(ps)
    if ps + pl == start then
      drop_free(ps)
      start, len = ps, len + pl
    end
  end
  local nl = free_len(start + len)
  if nl then
    drop_free(start + len)
    len = len + nl
  end
  put_free(start, len)
  return added
end

-- Free the allocation `member` and keep the byte totals.
local function free_used(member, s, l, cap)
  redis.call('ZREM', USED, member)
  redis.call('ZREM', PENDING, fmt(s))
  redis.call('HINCRBY', META, 'free', fmt(release(s, l, cap)))
  redis.call('HINCRBY', META, 'used', fmt(-l))
end

local function sync_capacity(cap)
  local cur = tonumber(redis.call('HGET', META, 'capacity') or '0')
  if cur == cap then return end
  local delta = 0
  if cap > cur then
    -- Free the gaps of [cur, cap) between ranges still in use from before a shrink.
    local pos = cur
    local before = redis.call('ZREVRANGEBYSCORE', USED, '(' .. fmt(cur), '-inf', 'LIMIT', 0, 1)
    if #before > 0 then
      local s, l = parse_used(before[1])
      if s + l > pos then pos = s + l end
    end
    for _, m in ipairs(redis.call('ZRANGEBYSCORE', USED, fmt(cur), '(' .. fmt(cap))) do
      local s, l = parse_used(m)
      if s > pos then delta = delta + release(pos, s - pos, cap) end
      if s + l > pos then pos = s + l end
    end
    if pos < cap then delta = delta + release(pos, cap - pos, cap) end
  else
    for _, m in ipairs(redis.call('ZRANGEBYSCORE', FREE_ADDR, fmt(cap), '+inf')) do
      local s = tonumber(m)
      delta = delta - free_len(s)
      drop_free(s)
    end
    local last = redis.call('ZREVRANGEBYSCORE', FREE_ADDR, '(' .. fmt(cap), '-inf', 'LIMIT', 0, 1)
    if #last > 0 then
      local s = tonumber(last[1])
      local l = free_len(s)
      if s + l > cap then
        put_free(s, cap - s)
        delta = delta - (s + l - cap)
      end
    end
  end
  redis.call('HINCRBY', META, 'free', fmt(delta))
  redis.call('HSET', META, 'capacity', fmt(cap))
end
