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
pool's bytes, and the allocation is what it owns. For the same reason ``read`` and ``write``
raise StorageCopyUnsupportedError: a copy from or to the pool needs the pool's own copy
service (upstream submits it to the pool and polls), which KVCM does not call yet.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any, cast

import redis
from redis.typing import EncodableT

from ..protocol.codes import StorageType
from ..protocol.errors import CapacityExceededError, InvalidArgumentError, ServiceNotReadyError
from ..protocol.models import StorageConfig
from ..valkey import Valkey, lua_source
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


LUA_DIR = Path(__file__).with_name("lua")


class ReserveResult(IntEnum):
    """First element of lua/mempool_reserve.lua's reply (``RESERVE_<name>`` in Lua)."""

    REFUSED = 0
    GRANTED = 1


def _load(name: str) -> str:
    """An allocator script after the codes it shares with Python and the allocator's
    prelude (lua/mempool_prelude.lua)."""
    codes = "".join(f"local RESERVE_{member.name} = {member.value}\n" for member in ReserveResult)
    return codes + lua_source(LUA_DIR, name, prelude="mempool_prelude")


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

    def __init__(
        self,
        config: StorageConfig,
        valkey: Valkey,
        key_prefix: str = "kvcm",
        reservation_ttl_s: float = DEFAULT_RESERVATION_TTL_S,
    ) -> None:
        self.check_config(config)
        super().__init__(config)
        spec = spec_of(config, self.spec_field)
        self.capacity = spec.capacity
        self.reservation_ttl_s = reservation_ttl_s
        self._endpoint = parse_host_port(spec.domain)
        self._timeout_s = (spec.timeout or DEFAULT_TIMEOUT_MS) / 1000
        self._valkey = valkey
        tag = f"{{{key_prefix}:mp:{self.name}}}"
        self._keys = [f"{tag}:{part}" for part in ("free_addr", "free_len", "used", "pending", "meta")]
        self._reserve_script = valkey.register_script(_load("mempool_reserve"))
        self._free_script = valkey.register_script(_load("mempool_free"))
        self._bind_script = valkey.register_script(_load("mempool_bind"))

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
    def sdk_spec(cls, config: StorageConfig) -> dict[str, Any]:
        """Upstream's pace spec: ``enable_vipserver``, ``domain`` and ``timeout`` (older
        SDKs require all three) plus ``service_discovery_url`` (newer SDKs); the pool's
        ``capacity`` is KVCM's allocator setting, not the engines' business."""
        spec = spec_of(config, cls.spec_field)
        return {
            "enable_vipserver": spec.service_discovery_url.startswith("vipserver://"),
            "domain": spec.domain,
            "timeout": spec.timeout,
            "service_discovery_url": spec.service_discovery_url,
        }

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
            reply = self._reserve_script(
                keys=self._keys,
                args=[self.capacity, count, block_bytes, self.reservation_ttl_s, unbound_tag(instance_id)],
            )
        if reply[0] != ReserveResult.GRANTED:
            raise PoolExhaustedError(
                f"storage {self.name}: memory pool cannot fit {count} block(s) of {block_bytes} bytes "
                f"({int(reply[1])} of {self.capacity} bytes free, largest free range {int(reply[2])})"
            )
        return [int(address) for address in reply[1:]]

    def prepare(self, blocks: Sequence[BlockRef]) -> None:
        """Bind the new blocks' ranges to them; a range that is not theirs any more is an error
        (its URI must not reach an engine)."""
        if not blocks:
            return
        args: list[EncodableT] = []
        for block in blocks:
            args += [block.group_id, unbound_tag(block.instance_id), owner_of(block)]
        with self._valkey_errors():
            bound = self._bind_script(keys=self._keys, args=args)
        if bound != len(blocks):
            raise StorageError(
                f"storage {self.name}: {len(blocks) - bound} reservation(s) were lost before the blocks were placed"
            )

    def _free(self, pairs: list[EncodableT]) -> None:
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
            hit = cast(
                list[bytes], self._valkey.zrangebyscore(self._keys[2], block.group_id, block.group_id, start=0, num=1)
            )
        return bool(hit) and _used_range(hit[0])[2] == owner_of(block)

    def uri_format(self, instance_id: str, spec: SpecSlot) -> UriFormat:
        offset = spec.offset

        def args(block_key: int, location_id: int, group_id: int, slot: int) -> tuple[int, ...]:
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
