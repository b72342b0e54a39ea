"""The block index callers use: ``BlockIndex`` picks, per instance layout, the
single-hash-tag index it extends (``TagIndex``) or, for an instance of several shards,
``ShardedIndex`` (docs/instance-sharding.md), so nothing above the index knows about
shards. The operations alike for any shard count (one pipeline over ``layout.shards``)
are here too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import cast

from redis.exceptions import NoScriptError

from ..clock import Clock
from ..observability.hit_feed import FeedEntry
from ..observability.logging import logger
from ..valkey import Valkey, valkey_errors
from .errors import StaleInstanceError
from .layout import PACKED_GROUP, ClaimOutcome, CopyGuard
from .records import BlockRecord, Victim, decode_record, decode_victims
from .sharding import ShardedIndex, shard_of
from .tag_index import TagIndex
from .types import (
    SHARD_BUCKET_SHIFT,
    DropOutcome,
    FinishOutcome,
    InstanceLayout,
    MarkClearing,
    RawHash,
    Session,
    StartOutcome,
    StartRequest,
    Usage,
    merge_counts,
    packed_groups,
    parse_suffixes,
    session_entries,
)


class BlockIndex(TagIndex):
    """Every read and state change of block records, usage and write sessions, for an
    instance of one shard or several."""

    def __init__(self, client: Valkey, prefix: str, clock: Clock) -> None:
        super().__init__(client, prefix, clock)
        #: A sharded instance's calls, split per shard onto this index's single-tag ones.
        self.sharded = ShardedIndex(self)

    # ---------------------------------------------------------------- per layout: one tag or several

    def read_raw(
        self,
        layout: InstanceLayout,
        block_keys: Sequence[int],
        mode: int,
        sw_size: int = 0,
        servable: Sequence[str] | None = None,
        covered: Sequence[bool] | None = None,
        feed: FeedEntry | None = None,
    ) -> list[bytes | None]:
        if not layout.shard_suffixes or not block_keys:
            return super().read_raw(layout, block_keys, mode, sw_size, servable, covered, feed)
        if feed is not None:
            self.append_feed(layout, feed)
        return self.sharded.read_raw(layout, block_keys, mode, sw_size, servable, covered)

    def start(
        self,
        layout: InstanceLayout,
        block_keys: Sequence[int],
        req: StartRequest,
        feed: Callable[[StartOutcome], FeedEntry | None] | None = None,
    ) -> StartOutcome:
        if not layout.shard_suffixes:
            return super().start(layout, block_keys, req, feed)
        outcome = self.sharded.start(layout, block_keys, req)
        entry = feed(outcome) if feed is not None else None
        if entry is not None:
            self.append_feed(layout, entry)
        return outcome

    def session(self, layout: InstanceLayout, session_id: str) -> Session | None:
        if not layout.shard_suffixes:
            return super().session(layout, session_id)
        return self.sharded.session(layout, session_id)

    def finish(
        self,
        layout: InstanceLayout,
        session_id: str,
        session: Session,
        success: Sequence[bool],
        sizes: Sequence[int],
        force_fail: bool = False,
        mark_clear: MarkClearing | None = None,
        release_guard: CopyGuard | None = None,
    ) -> FinishOutcome:
        if not layout.shard_suffixes:
            return super().finish(layout, session_id, session, success, sizes, force_fail, mark_clear, release_guard)
        return self.sharded.finish(layout, session_id, session, success, sizes, force_fail, mark_clear, release_guard)

    def mark_deleting(
        self,
        layout: InstanceLayout,
        block_keys: Sequence[int],
        sizes: Sequence[int],
        expected_locations: Sequence[int] | None = None,
        serving_only: bool = False,
        max_children: Sequence[int] | None = None,
        resubmit_before_s: int = 0,
        delay_ms: int = 0,
        lost_only: bool = False,
    ) -> list[Victim]:
        pick = super().mark_deleting if not layout.shard_suffixes or not block_keys else self.sharded.mark_deleting
        return pick(
            layout,
            block_keys,
            sizes,
            expected_locations,
            serving_only,
            max_children,
            resubmit_before_s,
            delay_ms,
            lost_only,
        )

    def restore(self, layout: InstanceLayout, victims: Sequence[Victim], sizes: Sequence[int]) -> int:
        if not layout.shard_suffixes or not victims:
            return super().restore(layout, victims, sizes)
        return self.sharded.restore(layout, victims, sizes)

    def drop(self, layout: InstanceLayout, victims: Sequence[Victim], sizes: Sequence[int]) -> DropOutcome:
        if not layout.shard_suffixes or not victims:
            return super().drop(layout, victims, sizes)
        return self.sharded.drop(layout, victims, sizes)

    def forget(self, layout: InstanceLayout, block_keys: Sequence[int], location_ids: Sequence[int]) -> int:
        if not layout.shard_suffixes or not block_keys:
            return super().forget(layout, block_keys, location_ids)
        return self.sharded.forget(layout, block_keys, location_ids)

    def occupied_page(self, layout: InstanceLayout, cursor: int, count: int) -> tuple[int, list[int]]:
        if not layout.shard_suffixes:
            return super().occupied_page(layout, cursor, count)
        return self.sharded.occupied_page(layout, cursor, count)

    def occupied_sample(self, layout: InstanceLayout, count: int) -> tuple[int, list[int]]:
        if not layout.shard_suffixes:
            return super().occupied_sample(layout, count)
        return self.sharded.occupied_sample(layout, count)

    def drop_all(self, layout: InstanceLayout, keep_usage: bool = False) -> None:
        for shard in layout.shards:
            super().drop_all(shard, keep_usage)

    # ---------------------------------------------------------------- alike for any shard count

    def reconcile_group(self, group: str, layouts: Sequence[InstanceLayout]) -> Usage | None:
        """Correct drift of the group's counters (a process that died between an
        instance's script and the group's update) from the sum of its instances.

        The group counter is read before and after the instances; the correction is
        applied only if it did not move meanwhile, so changes in flight are never
        counted twice. Returns the correction applied, or None when it had to skip."""
        key = self.group_usage_key(group)
        with valkey_errors("index"):
            before = cast(RawHash, self.client.hgetall(key))
        total = sum(self.usage(layouts), Usage())
        with valkey_errors("index"):
            after = cast(RawHash, self.client.hgetall(key))
        if before != after:
            return None
        current = Usage.from_hash(after)
        correction = Usage(
            total.bytes - current.bytes,
            total.keys - current.keys,
            merge_counts(total.by_type, current.by_type, -1),
            {},
            total.deleting_bytes - current.deleting_bytes,
            total.deleting_keys - current.deleting_keys,
            merge_counts(total.deleting_by_type, current.deleting_by_type, -1),
        )
        changes = self._group_fields(correction)
        if changes:
            pipe = self.client.pipeline(transaction=False)
            for name, value in changes.items():
                pipe.hincrby(key, name, value)
            with valkey_errors("index"):
                pipe.execute()
        return correction

    def read(
        self, layout: InstanceLayout, block_keys: Sequence[int], mode: int, sw_size: int = 0
    ) -> list[BlockRecord | None]:
        """Like ``read_raw`` with decoded records."""
        return [decode_record(r) if r else None for r in self.read_raw(layout, block_keys, mode, sw_size)]

    def rearm_session_deadlines(self, instance_ids: Sequence[str]) -> None:
        """Set each instance's place in the due set to its earliest open session's deadline,
        or take it out when it has none. Taken out first, then read: a start racing this
        adds its deadline after the removal, or its session is in the read."""
        if not instance_ids:
            return
        with valkey_errors("index"):
            self.client.zrem(self._session_due_key, *instance_ids)
        layouts = self.sharded.stored_layouts(instance_ids)
        pipe = self.client.pipeline(transaction=False)
        for layout in layouts:
            for shard in layout.shards:
                pipe.zrange(shard.key("sd"), 0, 0, withscores=True)
        with valkey_errors("index"):
            results = iter(pipe.execute())
        for layout in layouts:
            earliest = [int(score) for _ in layout.shards for _, score in next(results)]
            if earliest:
                self.queue_session_deadline(pipe, layout.instance_id, min(earliest))
        if len(pipe):
            with valkey_errors("index"):
                pipe.execute()

    def recount_caller_sessions(self, instance_ids: Sequence[str]) -> int:
        """Rebuild every shard's open sessions per caller from its open sessions
        (lua/recount_callers.lua: one atomic step per shard, so a start or finish racing it
        leaves the exact count), all in one round trip after the layouts' (the reaper's
        full sweep); returns how many (shard, caller) counts changed."""
        shards = [shard for layout in self.sharded.stored_layouts(instance_ids) for shard in layout.shards]
        calls = [([shard.key("sd"), shard.key("sc")], [shard.key("s:")]) for shard in shards]
        pipe = self.client.pipeline(transaction=False)
        for keys, args in calls:
            # execute_command: a cluster pipeline blocks its evalsha method, not the command.
            pipe.execute_command("EVALSHA", self._recount_callers.sha, len(keys), *keys, *args)
        with valkey_errors("index"):
            replies = pipe.execute(raise_on_error=False) if calls else []
        changed = 0
        for (keys, args), reply in zip(calls, replies, strict=True):
            if isinstance(reply, NoScriptError):  # a node without the script yet: alone
                reply = self._call(self._recount_callers, keys, args)
            elif isinstance(reply, Exception):
                with valkey_errors("index"):
                    raise reply
            changed += int(reply)
        return changed

    def due_sessions(self, instance_ids: Sequence[str], now_ms: int, limit: int = 1000) -> dict[str, list[str]]:
        """Ids of sessions past their deadline, per instance (every shard's), in two round trips."""
        layouts = self.sharded.stored_layouts(instance_ids)
        pipe = self.client.pipeline(transaction=False)
        for layout in layouts:
            for shard in layout.shards:
                pipe.zrangebyscore(shard.key("sd"), "-inf", now_ms, start=0, num=limit)
        with valkey_errors("index"):
            results = iter(pipe.execute())
        due: dict[str, list[str]] = {}
        for layout in layouts:
            ids = dict.fromkeys(s.decode() for _ in layout.shards for s in next(results))
            if ids:
                due[layout.instance_id] = list(ids)
        return due

    def open_session_entries(self, layout: InstanceLayout) -> set[tuple[int, int]]:
        """(block key, location id) of every entry of the instance's open write sessions
        (every shard's), in two round trips (the background GC: a WRITING location whose
        session is still open is never an orphan)."""
        pipe = self.client.pipeline(transaction=False)
        for shard in layout.shards:
            pipe.zrange(shard.key("sd"), 0, -1)
        with valkey_errors("index"):
            per_shard = cast(list[list[bytes]], pipe.execute())
        pipe = self.client.pipeline(transaction=False)
        for shard, session_ids in zip(layout.shards, per_shard, strict=True):
            for session_id in session_ids:
                pipe.hget(shard.session(session_id.decode()), "k")
        with valkey_errors("index"):
            blobs = cast(list[bytes | None], pipe.execute())
        return {entry for raw in blobs if raw for entry in session_entries(raw)}

    def overdue_deletions(self, layout: InstanceLayout, now_s: int, limit: int) -> list[tuple[int, int]]:
        """(block key, location id) of up to ``limit`` DELETING locations per shard whose
        hand-off counts as lost by ``now_s``, in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for shard in layout.shards:
            pipe.zrangebyscore(shard.key("pd"), "-inf", now_s, start=0, num=limit)
        with valkey_errors("index"):
            found = cast(list[list[bytes]], pipe.execute())
        return [session_entries(m)[0] for members in found for m in members]

    def forgotten(self, layout: InstanceLayout, count: int) -> list[Victim]:
        """Up to ``count`` forgotten locations of each shard, in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for shard in layout.shards:
            pipe.srandmember(shard.key("fg"), count)
        with valkey_errors("index"):
            members = cast(list[list[bytes]], pipe.execute())
        return decode_victims(b"".join(m for found in members for m in found))

    def release_forgotten(self, layout: InstanceLayout, victims: Sequence[Victim], sizes: Sequence[int]) -> int:
        """Release forgotten locations whose data is deleted: their bytes leave the usage
        counters, the group's too (lua/release.lua); returns how many were still held."""
        released = 0
        for s, shard in enumerate(layout.shards):
            mine = [v for v in victims if shard_of(v.block_key, layout.shard_count) == s]
            released += super().release_forgotten(shard, mine, sizes)
        return released

    def set_removing(self, layout: InstanceLayout, removing: bool) -> None:
        """Refuse (or again accept) new writes of the instance, every shard (lua/start.lua)."""
        pipe = self.client.pipeline(transaction=False)
        for shard in layout.shards:
            if removing:
                pipe.hset(shard.key("m"), "removing", 1)
            else:
                pipe.hdel(shard.key("m"), "removing")
        with valkey_errors("index"):
            pipe.execute()

    def orphan_groups(self, layout: InstanceLayout) -> list[tuple[int, int]]:
        """Packed groups whose last block is gone and whose files are not deleted yet (group
        ids are unique across shards: lua/claim.lua)."""
        pipe = self.client.pipeline(transaction=False)
        for shard in layout.shards:
            pipe.smembers(shard.key("og"))
        with valkey_errors("index"):
            members = [m for found in cast(list[set[bytes]], pipe.execute()) for m in found]
        return packed_groups(b"".join(members))

    def forget_orphan_groups(self, layout: InstanceLayout, groups: Sequence[tuple[int, int]]) -> None:
        """Called once the files of ``groups`` are deleted: they leave whichever shard's
        orphan set holds them (one round trip; removing a member a shard lacks is a no-op,
        so nothing here depends on which shard dropped the group)."""
        if not groups:
            return
        members = [PACKED_GROUP.pack(s, g) for s, g in groups]
        pipe = self.client.pipeline(transaction=False)
        for shard in layout.shards:
            pipe.srem(shard.key("og"), *members)
        with valkey_errors("index"):
            pipe.execute()

    # ---------------------------------------------------------------- usage and tables

    def claim(
        self,
        instance_id: str,
        incarnation: str,
        wanted_bits: int,
        registering: bool = False,
        shard_count: int = 1,
        group: str = "",
    ) -> InstanceLayout:
        """Bind the instance's key space to ``incarnation`` and return its layout: its bucket
        bits (``wanted_bits`` unless fixed already: set once, kept until the key space is
        dropped) and its shards (``shard_count`` for a new key space or one a registration
        takes over, else those it has: docs/instance-sharding.md). See lua/claim.lua. A
        registration (``registering``) takes the key space over from an earlier
        incarnation, dropping what that one left (a registration lost from the control
        plane: its data cannot be deleted without its specs, and is logged); otherwise
        another incarnation's key space raises StaleInstanceError."""
        meta = InstanceLayout(self.prefix, instance_id, wanted_bits, incarnation=incarnation)
        wanted_shards = ",".join(str(s) for s in self.sharded.pick_suffixes(instance_id, shard_count))
        for _ in range(2):
            others_hold = registering and self.sharded.others_hold(instance_id)
            bits, outcome, stored = self.claim_key_space(meta, registering, wanted_shards, others_hold)
            layout = InstanceLayout(self.prefix, instance_id, bits, group, incarnation, parse_suffixes(stored))
            if outcome == ClaimOutcome.STALE:
                raise StaleInstanceError(f"instance '{instance_id}' was registered again")
            if outcome == ClaimOutcome.UNTRACKED:
                self._ensure_tracked(layout.shards[0])
            if outcome != ClaimOutcome.OCCUPIED:
                self.sharded.claim_shards(layout)
                return layout
            self._ensure_tracked(layout.shards[0])
            usage = self.usage([layout])[0]
            logger.warning(
                "dropping the blocks of an earlier registration of the instance; their data stays on storage",
                extra={"instance_id": instance_id, "blocks": usage.keys, "bytes": usage.bytes},
            )
            self.drop_all(layout)
        raise StaleInstanceError(f"instance '{instance_id}' kept changing during registration, retry")

    def _ensure_tracked(self, layout: InstanceLayout) -> None:
        with valkey_errors("index"):
            tracked = self.client.hget(layout.key("m"), "ob")
        if tracked is None:
            self.track_occupancy(layout)
            with valkey_errors("index"):
                self.client.hset(layout.key("m"), "ob", 1)

    def track_occupancy(self, layout: InstanceLayout) -> int:
        """Build the occupied-bucket set of an instance by probing every bucket (once per
        instance written before the set existed); returns how many are occupied."""
        found = 0
        step = 4096
        buckets = self.bucket_count(layout)
        for start in range(0, buckets, step):
            indexes = range(start, min(start + step, buckets))
            pipe = self.client.pipeline(transaction=False)
            for b in indexes:
                pipe.exists(layout.bucket(b))
            with valkey_errors("index"):
                occupied = [b for b, exists in zip(indexes, pipe.execute(), strict=True) if exists]
            if occupied:
                with valkey_errors("index"):
                    self.client.sadd(layout.occupied, *occupied)
                found += len(occupied)
        return found

    def usage(self, layouts: Sequence[InstanceLayout]) -> list[Usage]:
        """Usage of several instances (summed over their shards) in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for layout in layouts:
            for shard in layout.shards:
                pipe.hgetall(shard.key("u"))
        with valkey_errors("index"):
            results = iter(pipe.execute())
        return [sum((Usage.from_hash(next(results)) for _ in layout.shards), Usage()) for layout in layouts]

    # ---------------------------------------------------------------- occupied buckets

    def bucket_counts(self, layout: InstanceLayout) -> list[int]:
        """How many buckets each shard's records are addressed over now (lua/prelude.lua
        bucket_count), one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for shard in layout.shards:
            pipe.hmget(shard.key("m"), "n", "bits")
        with valkey_errors("index"):
            replies = cast(list[list[bytes | None]], pipe.execute())
        return [int(n) if n else 1 << int(bits or 0) for n, bits in replies]

    def bucket_count(self, layout: InstanceLayout) -> int:
        """How many buckets the instance's records are addressed over now (every shard's)."""
        return sum(self.bucket_counts(layout))

    def split_since(
        self, layout: InstanceLayout, counts: Sequence[int], sources_from: Sequence[int] = ()
    ) -> tuple[list[int], list[int]]:
        """The bucket counts now, and the buckets split off since each shard had ``counts``
        (bucket numbers as ``occupied_page`` gives them). With ``sources_from``, only if
        one of those splits took records from a bucket at or past its shard's entry (a
        split adding bucket b takes them from b - 2^L: lua/prelude.lua grow_buckets)."""
        now = self.bucket_counts(layout)
        shard_bits = SHARD_BUCKET_SHIFT if layout.shard_suffixes else 0
        added = [(s, b) for s, (was, count) in enumerate(zip(counts, now, strict=True)) for b in range(was, count)]
        if sources_from and not any(b - (1 << (b.bit_length() - 1)) >= sources_from[s] for s, b in added):
            return now, []
        return now, [b | (s << shard_bits if shard_bits else 0) for s, b in added]

    def occupied_count(self, layout: InstanceLayout) -> int:
        """How many buckets hold records (every shard's)."""
        pipe = self.client.pipeline(transaction=False)
        for shard in layout.shards:
            pipe.scard(shard.occupied)
        with valkey_errors("index"):
            return sum(int(n) for n in pipe.execute())

    def read_buckets(self, layout: InstanceLayout, buckets: Sequence[int]) -> list[tuple[int, bytes]]:
        """Every (block key, raw record) of several buckets, one round trip per
        ``SCAN_BATCH`` buckets."""
        out: list[tuple[int, bytes]] = []
        for start in range(0, len(buckets), self.SCAN_BATCH):
            pipe = self.client.pipeline(transaction=False)
            for b in buckets[start : start + self.SCAN_BATCH]:
                pipe.hgetall(layout.bucket(b))
            with valkey_errors("index"):
                contents = pipe.execute()
            out += [(int.from_bytes(f, "big", signed=True), r) for c in contents for f, r in c.items()]
        return out

    def scan(self, layout: InstanceLayout, page: int = 256) -> Iterator[tuple[int, bytes]]:
        """Every (block key, raw record) of an instance, through its occupied buckets."""
        cursor = 0
        while True:
            cursor, buckets = self.occupied_page(layout, cursor, page)
            yield from self.read_buckets(layout, buckets)
            if cursor == 0:
                return

    def advance_sweep(self, layout: InstanceLayout, count: int) -> list[int]:
        """The next about ``count`` occupied buckets of the instance's TTL sweep (an SSCAN
        cursor kept in Valkey, so successive rounds on any node cover every occupied
        bucket, and a pass costs what the instance holds)."""
        with valkey_errors("index"):
            position = int(self.client.hget(layout.key("m"), "sweep") or 0)
        position, buckets = self.occupied_page(layout, position, count)
        with valkey_errors("index"):
            self.client.hset(layout.key("m"), "sweep", position)
        return buckets
