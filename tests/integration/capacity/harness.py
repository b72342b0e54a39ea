"""A group of instances on a real Valkey block index, built without the control plane:
contexts are made directly, deletion drops metadata only (no backend), and the reclaimer
sees the group through a static directory. Used by the tests here and by
bench/bench_reclaim.py."""

from __future__ import annotations

import contextlib
import io
import json
import random
from collections import defaultdict
from dataclasses import dataclass, field

import redis

from chalicelib.cache.context import InstanceContext, SpecLayout
from chalicelib.cache.deletion import DeletionService, InlineDeleter
from chalicelib.capacity import Reclaimer, SamplingConfig
from chalicelib.clock import ManualClock
from chalicelib.control.groups import normalize_group
from chalicelib.index import BlockIndex, Status
from chalicelib.index.records import BlockRecord, decode_record
from chalicelib.index.types import MODE_PREFIX, StartRequest, bucket_index
from chalicelib.observability.events import EventLog
from chalicelib.protocol.errors import InstanceNotFoundError
from chalicelib.protocol.models import InstanceGroup, LocationSpecInfo, StorageConfig
from tests.fakes.records import serving
from tests.helpers import SPECS, api_caller

BLOCK = 1024
STORAGES = {"nfs_01": "ST_NFS", "s3_01": "ST_S3"}


def make_group(
    capacity_blocks: int = 0,
    used_percentage: float = 0.9,
    policy: str = "POLICY_LRU",
    step_percentage: int = 10,
    ttl_seconds: int = 0,
    max_keys: int = 0,
    delay_ms: int = 0,
    type_quota: dict[str, int] | None = None,
    period_s: int = 10,
    step_blocks: int = 0,
    budget: str | None = None,
) -> InstanceGroup:
    """A stored-looking (normalized) group of 1 KiB blocks; ``budget`` is its
    ``instance_reclaim_budget_policy`` (None: absent, the default)."""
    return normalize_group(
        InstanceGroup.model_validate(
            {
                "name": "g",
                "storage_candidates": list(STORAGES),
                "quota": {
                    "capacity": capacity_blocks * BLOCK,
                    "quota_config": [{"storage_type": t, "capacity": n * BLOCK} for t, n in (type_quota or {}).items()],
                },
                "cache_config": {
                    "reclaim_strategy": {
                        "reclaim_policy": policy,
                        "trigger_strategy": {"used_percentage": used_percentage},
                        "reclaim_step_percentage": step_percentage,
                        "reclaim_step_size": step_blocks * BLOCK,
                        "ttl_seconds": ttl_seconds,
                        "delay_before_delete_ms": delay_ms,
                        "trigger_period_seconds": period_s,
                        "instance_reclaim_budget_policy": budget,
                    },
                    "meta_indexer_config": {"max_key_count": max_keys},
                },
            }
        )
    )


@dataclass
class Cluster:
    """One group's instances on the index, and the reclaimer's view of them."""

    index: BlockIndex
    clock: ManualClock
    group: InstanceGroup = field(default_factory=make_group)
    contexts: dict[str, InstanceContext] = field(default_factory=dict)
    rng: random.Random = field(default_factory=lambda: random.Random(11))
    events: io.StringIO = field(default_factory=io.StringIO)
    _sessions: int = 0

    # ------------------------------------------------------------ setup

    def add_instance(self, instance_id: str, bucket_bits: int = 4) -> InstanceContext:
        ctx = InstanceContext(
            instance_id=instance_id,
            group=self.group,
            block_size=4,
            spec_layout=SpecLayout((LocationSpecInfo(name="tp0", size=BLOCK),), ()),
            layout=self.index.layout(instance_id, bucket_bits, self.group.name),
            storages=(),
        )
        self.contexts[instance_id] = ctx
        return ctx

    def keys(self, count: int) -> list[int]:
        return [self.rng.getrandbits(63) for _ in range(count)]

    def write(self, instance_id: str, keys: list[int], finish: bool = True, storage: str = "nfs_01") -> None:
        """One startWriteCache of ``keys`` (a prefix chain), finished unless told not to."""
        self._sessions += 1
        session_id = f"s{self._sessions}"
        layout = self.contexts[instance_id].layout
        self.index.start(
            layout,
            keys,
            StartRequest(
                session_id=session_id,
                deadline_ms=int(self.clock.now() * 1000) + 3_600_000,
                storage_name=storage,
                storage_type=STORAGES[storage],
                pack_count=0,
                sizes=[BLOCK],
                spec_groups=[0] * len(keys),
            ),
        )
        if finish:
            session = self.index.session(layout, session_id)
            self.index.finish(layout, session_id, session, [True] * len(session.entries), [BLOCK])

    def chains(self, instance_id: str, count: int, length: int, **kw) -> list[list[int]]:
        out = [self.keys(length) for _ in range(count)]
        for chain in out:
            self.write(instance_id, chain, **kw)
        return out

    def bulk_chains(self, instance_id: str, count: int, length: int) -> None:
        """``count`` prefix chains written straight into Valkey as start + finish leave them
        (SERVING, linked, counted in usage): thousands of script calls spared."""
        layout = self.contexts[instance_id].layout
        now_s = int(self.clock.now())
        blocks = count * length
        # The buckets as starts would have grown them (lua/prelude.lua grow_buckets).
        bucket_count = max(1 << layout.bucket_bits, -(-blocks // self.index.RECORDS_PER_BUCKET))
        buckets: dict[bytes, dict[bytes, bytes]] = defaultdict(dict)
        occupied = set()
        location = 0
        for _ in range(count):
            chain = self.keys(length)
            for i, key in enumerate(chain):
                location += 1
                raw = serving(location, parent=chain[i - 1] if i else None, children=int(i < length - 1), atime=now_s)
                bucket = bucket_index(key, bucket_count)
                buckets[layout.bucket(bucket)][key.to_bytes(8, "big", signed=True)] = raw
                occupied.add(bucket)
        pipe = self.index.client.pipeline(transaction=False)
        for bucket, records in buckets.items():
            pipe.hset(bucket, mapping=records)
        pipe.hset(layout.key("st"), mapping={"nfs_01": 1, "#1": "nfs_01", "t1": "ST_NFS"})
        pipe.hset(
            layout.key("m"),
            mapping={"storages": 1, "loc": location, "bits": layout.bucket_bits, "n": bucket_count, "ob": 1},
        )
        pipe.sadd(layout.occupied, *occupied)
        usage = {"bytes": blocks * BLOCK, "keys": blocks, "t:ST_NFS": blocks * BLOCK, "s:nfs_01": blocks * BLOCK}
        pipe.hset(layout.key("u"), mapping=usage)
        for name, value in usage.items():
            pipe.hincrby(self.index.group_usage_key(self.group.name), name, value)
        pipe.execute()

    def read(self, instance_id: str, keys: list[int]) -> None:
        """A served prefix read (refreshes recency at most once a second per block)."""
        self.index.read(self.contexts[instance_id].layout, keys, MODE_PREFIX)

    # ------------------------------------------------------------ the reclaimer

    def groups(self) -> list[InstanceGroup]:
        return [self.group]

    def members(self, group: str, fresh: bool = False) -> list[str]:
        return list(self.contexts) if group == self.group.name else []

    def context(self, instance_id: str) -> InstanceContext:
        try:
            return self.contexts[instance_id]
        except KeyError:
            raise InstanceNotFoundError(instance_id) from None

    def reclaimer(self, deleter=None, config: SamplingConfig = SamplingConfig(), seed: int = 3) -> Reclaimer:
        return Reclaimer(
            self.index,
            self,
            self.context,
            deleter or InlineDeleter(DeletionService(self.index)),
            self.clock,
            events=EventLog(self.events),
            rng=random.Random(seed),
            config=config,
        )

    # ------------------------------------------------------------ inspection

    def records(self, instance_id: str) -> dict[int, BlockRecord]:
        return {k: decode_record(r) for k, r in self.index.scan(self.contexts[instance_id].layout)}

    def statuses(self, instance_id: str) -> dict[int, Status]:
        return {k: r.locations[0].status for k, r in self.records(instance_id).items()}

    def used(self, instance_id: str):
        return self.index.usage([self.contexts[instance_id].layout])[0]

    def event_lines(self) -> list[dict]:
        return [json.loads(line) for line in self.events.getvalue().splitlines()]

    def assert_no_orphans(self, instance_id: str) -> None:
        """Every remaining block's prefix parent is still there."""
        records = self.records(instance_id)
        orphans = [k for k, r in records.items() if r.parent is not None and r.parent not in records]
        assert not orphans, f"{len(orphans)} blocks lost their parent"


class CountingConnection(redis.Connection):
    """Counts what goes over the wire: one send per command, pipeline or script call."""

    sends = 0

    def send_packed_command(self, command, check_health=True):
        type(self).sends += 1
        super().send_packed_command(command, check_health)


def counting_client(url: str) -> tuple[redis.Redis, type[CountingConnection]]:
    """A client whose round trips are counted in the returned class's ``sends``."""
    counting = type("Counting", (CountingConnection,), {"sends": 0})
    return redis.Redis.from_url(url, connection_class=counting), counting


def server_calls(client: redis.Redis) -> int:
    """Commands the server ran (script bodies' commands included), INFO aside."""
    stats = client.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k not in ("cmdstat_info", "cmdstat_config|resetstat"))


@contextlib.contextmanager
def full_group_api(
    runtime, root, group: str, capacity: int, instance_ids: tuple[str, ...], spec_groups: list | None = None
):
    """The HTTP meta API over group ``group`` of ``capacity`` bytes on one NFS storage in
    ``root``, with a watermark of 100 % (only the write path makes room) and its instances
    registered; yields ``call(method, body) -> answer``."""
    from chalice.test import Client

    import app

    runtime.control.add_storage(
        StorageConfig.model_validate(
            {"global_unique_name": "nfs_01", "nfs": {"root_path": str(root), "key_count_per_file": 1}}
        )
    )
    runtime.control.create_group(
        InstanceGroup.model_validate(
            {
                "name": group,
                "storage_candidates": ["nfs_01"],
                "quota": {"capacity": capacity},
                "cache_config": {"reclaim_strategy": {"trigger_strategy": {"used_percentage": 1.0}}},
            }
        )
    )
    with Client(app.app) as client:
        call = api_caller(client)
        for instance_id in instance_ids:
            resp = call(
                "registerInstance",
                {
                    "instance_group": group,
                    "instance_id": instance_id,
                    "block_size": 4,
                    "location_spec_infos": SPECS,
                    "location_spec_groups": spec_groups or [],
                    "model_deployment": {"model_name": "m", "dtype": "fp16"},
                },
            )
            assert resp["header"]["status"]["code"] == "OK", resp
        yield call
