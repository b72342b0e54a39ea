"""Tair memory pool storage (``tair_mem_pool{domain, timeout, capacity, service_discovery_url}``).

KVCM allocates address ranges of the pool's declared ``capacity`` bytes; engines read and
write the bytes there. ``reserve`` returns one range of ``block_bytes`` per new block (its
address is the block's group id), and spec ``i`` of a block lives at ``address + offset``.

Allocator. The state lives in Valkey, because every Lambda container allocates from the
same pool, and every reserve, bind or free is ONE Lua script call, so it is atomic. All
keys of a pool share the hash tag ``{<prefix>:mp:<name>}`` (one cluster slot):

- ``:free_addr`` sorted set, member = start of a free range, score = start (neighbours);
- ``:free_len``  sorted set, member = start of a free range, score = its length (best fit);
- ``:used``      sorted set, member = ``start:length:owner``, score = start;
- ``:pending``   sorted set of unbound reservations, member = start, score = reserve time;
- ``:meta``      hash: ``capacity`` the allocator was last sized for, ``free``/``used`` bytes.

Free ranges are kept maximal: a freed range merges with free neighbours, so free + used
= capacity and no two free ranges touch. Allocation is best fit (the smallest free range
that holds a block; a range gives as many consecutive blocks as fit). A reserve that
cannot be satisfied in full leaves nothing allocated and raises ``PoolExhaustedError``.

Ownership. A reservation starts unbound, tagged with its instance (``-<fingerprint>``).
``prepare`` — called by startWriteCache once the index has given the blocks location ids
— binds each range to its block (``<fingerprint>.<location id>``). ``delete`` frees a
range only while it is bound to that very block and ``unreserve`` only while it is still
unbound for that instance, so retries are idempotent and a late retry of a deletion,
arriving after its range went to another block (best fit picks exactly such a range
first), frees nothing. A reservation still unbound ``reservation_ttl_s`` after it was made
(longer than any request can run) belongs to a request that died between reserve and
prepare, so no engine ever got its URI; the next reserve frees it.

Capacity changes (updateStorage) are applied by the next script call: growing frees the
new tail, shrinking drops free space past the end; ranges in use past a new end stay
allocated until freed and are then dropped.

URI: ``pace://<global_unique_name>/<address + spec.offset>?size=<spec size>`` (the address is
the path, where upstream's engine SDK reads it).
Health: TCP connect to ``domain`` (``host:port``) within ``timeout`` ms (default 1000).
``exists`` reports whether the block's range is still allocated to it: KVCM cannot see the
pool's bytes, and the allocation is what it owns.
"""
from __future__ import annotations

import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

import redis

from ..protocol.codes import StorageType
from ..protocol.errors import CapacityExceededError, InvalidArgumentError, ServiceNotReadyError
from ..protocol.models import StorageConfig
from .base import BlockRef, SpecSlot, StorageBackend, StorageError, UriFormat
from .checks import config_error, spec_of
from .naming import DECIMAL, uri_template
from .net import parse_host_port, probe_tcp

#: Group ids are addresses, and the index stores 48-bit group ids.
MAX_CAPACITY = 1 << 48
DEFAULT_TIMEOUT_MS = 1000
#: Longer than any request may run between reserve and prepare (Lambda's limit is 900 s).
DEFAULT_RESERVATION_TTL_S = 1800


class PoolExhaustedError(CapacityExceededError):
    """The pool has no room for the whole reservation (wire REACH_MAX_ENTITY_CAPACITY)."""


@dataclass(frozen=True)
class PoolSnapshot:
    """A consistent view of a pool's allocator, for diagnostics and tests."""

    capacity: int
    free_bytes: int
    used_bytes: int
    free: list[tuple[int, int]]
    used: list[tuple[int, int]]
    unbound: int


# Lua numbers are doubles: exact for integers below 2**53, which bounds capacity (2**48).
# Every number handed to redis.call goes through fmt(): the default number-to-string
# conversion prints "%.14g" and would corrupt large addresses.
_LUA_COMMON = """
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
"""

# ARGV: capacity, count, block_bytes, reservation ttl (s), unbound owner tag.
# Returns {1, address...} or {0, free bytes, largest free range}.
_RESERVE = _LUA_COMMON + """
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
  return {0, tonumber(redis.call('HGET', META, 'free') or '0'), tonumber(largest[2] or '0')}
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
local out = {1}
for _, a in ipairs(got) do
  redis.call('ZADD', USED, fmt(a), fmt(a) .. ':' .. fmt(size) .. ':' .. tag)
  redis.call('ZADD', PENDING, string.format('%.6f', now), fmt(a))
  out[#out + 1] = a
end
redis.call('HINCRBY', META, 'free', fmt(-count * size))
redis.call('HINCRBY', META, 'used', fmt(count * size))
return out
"""

# ARGV: capacity, then (address, owner) pairs; a range is freed only when its owner is the
# one named. Returns the number of ranges freed.
_FREE = _LUA_COMMON + """
local cap = tonumber(ARGV[1])
sync_capacity(cap)
local freed = 0
for i = 2, #ARGV, 2 do
  local member, s, l, owner = used_at(ARGV[i])
  if member and owner == ARGV[i + 1] then
    free_used(member, s, l, cap)
    freed = freed + 1
  end
end
return freed
"""

# ARGV: (address, unbound tag, owner) triples. Binds ranges still unbound for that tag;
# returns how many ranges are now bound to their owner (binding twice is fine).
_BIND = _LUA_COMMON + """
local bound = 0
for i = 1, #ARGV, 3 do
  local member, s, l, owner = used_at(ARGV[i])
  if member and owner == ARGV[i + 1] then
    redis.call('ZREM', USED, member)
    redis.call('ZREM', PENDING, fmt(s))
    redis.call('ZADD', USED, fmt(s), fmt(s) .. ':' .. fmt(l) .. ':' .. ARGV[i + 2])
    bound = bound + 1
  elseif member and owner == ARGV[i + 2] then
    bound = bound + 1
  end
end
return bound
"""


def _text(value: bytes | str) -> str:
    # The injected client may or may not decode responses.
    return value.decode() if isinstance(value, bytes) else value


def _used_range(member: bytes | str) -> tuple[int, int, str]:
    start, length, owner = _text(member).split(":", 2)
    return int(start), int(length), owner


def _fingerprint(instance_id: str) -> str:
    # Short members; enough to tell apart the few instances whose location ids could meet.
    return f"{zlib.crc32(instance_id.encode('utf-8', 'surrogatepass')):08x}"


def unbound_tag(instance_id: str) -> str:
    """The owner of an instance's reservations before ``prepare`` binds them."""
    return "-" + _fingerprint(instance_id)


def owner_of(block: BlockRef) -> str:
    """The owner a block's range is bound to: its instance and location id (location ids
    are counted per instance)."""
    return f"{_fingerprint(block.instance_id)}.{block.location_id}"


class TairMemPoolBackend(StorageBackend):
    """A Tair memory pool whose address space KVCM allocates in Valkey."""

    storage_type = StorageType.ST_TAIRMEMPOOL
    spec_field = "tair_mem_pool"
    sdk_type = "pace"
    read_weight = 3

    def __init__(self, config: StorageConfig, valkey: redis.Redis, key_prefix: str = "kvcm",
                 reservation_ttl_s: float = DEFAULT_RESERVATION_TTL_S) -> None:
        self.check_config(config)
        super().__init__(config)
        spec = config.tair_mem_pool
        self.capacity = spec.capacity
        self.reservation_ttl_s = reservation_ttl_s
        self._endpoint = parse_host_port(spec.domain)
        self._timeout_s = (spec.timeout or DEFAULT_TIMEOUT_MS) / 1000
        self._valkey = valkey
        tag = f"{{{key_prefix}:mp:{self.name}}}"
        self._keys = [f"{tag}:{part}" for part in ("free_addr", "free_len", "used", "pending", "meta")]
        self._reserve_script = valkey.register_script(_RESERVE)
        self._free_script = valkey.register_script(_FREE)
        self._bind_script = valkey.register_script(_BIND)

    @classmethod
    def check_config(cls, config: StorageConfig) -> None:
        """Raise InvalidArgumentError naming the first invalid ``tair_mem_pool`` field."""
        spec = spec_of(config, cls.spec_field)
        if not 0 < spec.capacity <= MAX_CAPACITY:
            raise config_error(config, "tair_mem_pool.capacity", f"must be in (0, 2**48], got {spec.capacity}")
        if spec.timeout < 0:
            raise config_error(config, "tair_mem_pool.timeout", f"must be >= 0 (ms), got {spec.timeout}")
        try:
            parse_host_port(spec.domain)
        except ValueError as exc:
            raise config_error(config, "tair_mem_pool.domain", f"must be host:port ({exc})") from None

    @classmethod
    def sdk_spec(cls, config: StorageConfig) -> dict:
        """Upstream's pace spec: ``enable_vipserver``, ``domain`` and ``timeout`` (older
        SDKs require all three) plus ``service_discovery_url`` (newer SDKs); the pool's
        ``capacity`` is KVCM's allocator setting, not the engines' business."""
        spec = config.tair_mem_pool
        return {"enable_vipserver": spec.service_discovery_url.startswith("vipserver://"), "domain": spec.domain,
                "timeout": spec.timeout, "service_discovery_url": spec.service_discovery_url}

    @property
    def pack_count(self) -> int:
        return 0

    @contextmanager
    def _valkey_errors(self) -> Iterator[None]:
        try:
            yield
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise ServiceNotReadyError(f"storage {self.name}: allocator unreachable: {exc}") from exc
        except redis.RedisError as exc:
            raise StorageError(f"storage {self.name}: allocator failed: {exc}") from exc

    def reserve(self, instance_id: str, count: int, block_bytes: int) -> list[int]:
        """Addresses of ``count`` non-overlapping ranges of ``block_bytes``; all or nothing."""
        if count < 0 or block_bytes <= 0:
            raise InvalidArgumentError(f"cannot reserve {count} block(s) of {block_bytes} bytes")
        if count == 0:
            return []
        with self._valkey_errors():
            reply = self._reserve_script(keys=self._keys, args=[
                self.capacity, count, block_bytes, self.reservation_ttl_s, unbound_tag(instance_id)])
        if reply[0] != 1:
            raise PoolExhaustedError(
                f"storage {self.name}: memory pool cannot fit {count} block(s) of {block_bytes} bytes "
                f"({int(reply[1])} of {self.capacity} bytes free, largest free range {int(reply[2])})")
        return [int(address) for address in reply[1:]]

    def prepare(self, blocks: Sequence[BlockRef]) -> None:
        """Bind the new blocks' ranges to them; a range that is not theirs any more is an error
        (its URI must not reach an engine)."""
        if not blocks:
            return
        args: list[object] = []
        for block in blocks:
            args += [block.group_id, unbound_tag(block.instance_id), owner_of(block)]
        with self._valkey_errors():
            bound = self._bind_script(keys=self._keys, args=args)
        if bound != len(blocks):
            raise StorageError(f"storage {self.name}: {len(blocks) - bound} reservation(s) were lost before "
                               f"the blocks were placed")

    def _free(self, pairs: list[object]) -> None:
        if not pairs:
            return
        with self._valkey_errors():
            self._free_script(keys=self._keys, args=[self.capacity, *pairs])

    def unreserve(self, instance_id: str, group_ids: Sequence[int], block_bytes: int) -> None:
        """Free this instance's reservations that were never bound; anything else is left alone."""
        tag = unbound_tag(instance_id)
        self._free([item for group_id in group_ids for item in (group_id, tag)])

    def delete(self, blocks: Sequence[BlockRef]) -> None:
        """Free the ranges bound to these blocks (the bytes need no wiping); idempotent."""
        self._free([item for block in blocks for item in (block.group_id, owner_of(block))])

    def exists(self, block: BlockRef) -> bool:
        """Whether the block's range is still allocated to it."""
        with self._valkey_errors():
            hit = self._valkey.zrangebyscore(self._keys[2], block.group_id, block.group_id, start=0, num=1)
        return bool(hit) and _used_range(hit[0])[2] == owner_of(block)

    def uri_format(self, instance_id: str, spec: SpecSlot) -> UriFormat:
        offset = spec.offset

        def args(block_key: int, location_id: int, group_id: int, slot: int) -> tuple:
            return (group_id + offset,)

        # Upstream's SDK reads the address from the path (``pace://<name>/<address>``).
        return UriFormat(uri_template(self.sdk_type, self.name, ("/", DECIMAL), (("size", spec.size),)), args)

    def probe(self) -> None:
        """TCP connect to ``domain`` within ``timeout`` ms."""
        probe_tcp(self.name, [self._endpoint], self._timeout_s)

    def snapshot(self) -> PoolSnapshot:
        """Every free and used range, read atomically (O(ranges): not for hot paths)."""
        _, free_len, used, pending, meta = self._keys
        with self._valkey_errors():
            pipe = self._valkey.pipeline(transaction=True)
            pipe.zrange(free_len, 0, -1, withscores=True)
            pipe.zrange(used, 0, -1)
            pipe.zcard(pending)
            pipe.hgetall(meta)
            free_rows, used_rows, unbound, fields = pipe.execute()
        meta_fields = {_text(k): int(v) for k, v in fields.items()}
        return PoolSnapshot(
            capacity=meta_fields.get("capacity", 0),
            free_bytes=meta_fields.get("free", 0),
            used_bytes=meta_fields.get("used", 0),
            free=sorted((int(start), int(length)) for start, length in free_rows),
            used=sorted(_used_range(member)[:2] for member in used_rows),
            unbound=unbound,
        )
