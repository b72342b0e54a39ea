"""Instances spread over several hash tags (docs/instance-sharding.md).

An instance of k > 1 shards keeps k independent key spaces: shard 0 under
``{<prefix>:<instance>}`` (the layout of an instance of one shard), shard s under
``{<prefix>:<instance>#<suffix s>}``, the suffixes chosen at registration so that the
shards' slots fall on distinct masters. A block belongs to shard ``(key >> 40) mod k``:
bits the bucket index (the low 24) never reads, so buckets fill evenly in every shard.

Every per-key transition stays one script call within its shard, moving that shard's
usage counters; ``ShardedIndex`` splits a call's keys per shard, runs one call per shard
at once (threads: each waits on its own master, so a call still costs one round trip of
latency) and merges the replies. ``BlockIndex`` hands a sharded layout's calls here, so
nothing above the index knows about shards; ``ShardedIndex`` needs of a single-tag index
only the primitives of ``ShardPrimitives``.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Protocol

from redis.cluster import RedisCluster

from ..protocol.models import MAX_INSTANCE_SHARDS
from ..valkey import Valkey, valkey_errors
from .errors import InstanceGoneError, WriteSessionError
from .layout import REQUEST_POSITION, ClaimOutcome, CopyGuard, ReadMode
from .records import Victim
from .types import (
    SHARD_BUCKET_SHIFT,
    DropOutcome,
    FinishOutcome,
    InstanceLayout,
    MarkClearing,
    MarkCounts,
    Session,
    StartOutcome,
    StartRequest,
    Usage,
    parse_suffixes,
    rightmost_window,
    session_entries,
)

#: Shard s hands out location ids from s << LOCATION_ID_SHARD_SHIFT (lua/claim.lua).
LOCATION_ID_SHARD_SHIFT = 36
#: A sharded occupied-bucket cursor keeps its shard in these low bits.
_CURSOR_SHARD_BITS = 4

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def shard_of(block_key: int, shard_count: int) -> int:
    """The shard a block belongs to."""
    return (block_key >> 40) % shard_count


def share(total: int, shard_count: int, shard: int) -> int:
    """Shard ``shard``'s part of a per-instance limit (0 = none stays none; a positive
    limit smaller than the shard count still leaves each shard 1)."""
    if total <= 0:
        return 0
    return max(1, total // shard_count + (1 if shard < total % shard_count else 0))


def shard_positions(block_keys: Sequence[int], shard_count: int) -> list[list[int]]:
    """Per shard, the request positions of its keys (in request order)."""
    out: list[list[int]] = [[] for _ in range(shard_count)]
    for i, key in enumerate(block_keys):
        out[shard_of(key, shard_count)].append(i)
    return out


def queue_marks(pipe: Any, layout: InstanceLayout) -> None:
    """Queue a read of each shard's Mark count ('mk'); ``summed_marks`` adds the replies up."""
    for shard in layout.shards:
        pipe.hget(shard.key("u"), "mk")


def summed_marks(replies: Sequence[Any]) -> int:
    """The instance's Marks: the sum of its shards' counts (``queue_marks``' replies). Each
    shard's count is exact in its shard; the sum is as of the reads, one per shard."""
    return sum(int(v or 0) for v in replies)


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=4 * MAX_INSTANCE_SHARDS, thread_name_prefix="kvcm-shard")
        return _pool


def settle[T](calls: Sequence[Callable[[], T]]) -> list[tuple[T | None, BaseException | None]]:
    """Run ``calls`` at once (the first in this thread) and wait for all: per call its
    result or its exception."""
    futures: list[Future[T]] = [_executor().submit(call) for call in calls[1:]]
    out: list[tuple[T | None, BaseException | None]] = []
    for call in calls[:1]:
        try:
            out.append((call(), None))
        except Exception as exc:  # noqa: BLE001 - handed back with the others
            out.append((None, exc))
    for future in futures:
        error = future.exception()
        out.append((None, error) if error is not None else (future.result(), None))
    return out


def first_refusal(errors: Sequence[BaseException]) -> BaseException:
    """The error to raise of a call's failed shards: InstanceGoneError first (the instance
    is going, whatever else a shard said), else the first."""
    return next((e for e in errors if isinstance(e, InstanceGoneError)), errors[0])


def gather[T](calls: Sequence[Callable[[], T]]) -> list[T]:
    """Run ``calls`` at once; their results, or the first exception once all ended."""
    settled = settle(calls)
    for _, exc in settled:
        if exc is not None:
            raise exc
    return [result for result, _ in settled]  # type: ignore[misc]


@dataclass(frozen=True)
class ShardedSession(Session):
    """A write session of a sharded instance: a part in each shard its start touched.

    ``entries`` are in the order of the start's new keys (the order ``success_blocks``
    follows), restored from each part's request positions ('o'); ``origin`` maps each
    entry to (part index, index in the part)."""

    parts: tuple[tuple[int, Session], ...] = ()
    origin: tuple[tuple[int, int], ...] = ()
    #: False when a part has no positions (started by a version that wrote them after
    #: start.lua, and lost them): the session can still be failed, not finished.
    ordered: bool = True


class ShardPrimitives(Protocol):
    """What ``ShardedIndex`` calls on one shard (a layout of one hash tag): ``TagIndex``'s
    operations of the same names."""

    client: Valkey
    prefix: str

    def read_raw(
        self,
        layout: InstanceLayout,
        block_keys: Sequence[int],
        mode: int,
        sw_size: int,
        servable: Sequence[str] | None,
        covered: Sequence[bool] | None,
    ) -> list[bytes | None]: ...

    def grant(self, layout: InstanceLayout, block_keys: Sequence[int], req: StartRequest) -> StartOutcome: ...

    def session(self, layout: InstanceLayout, session_id: str) -> Session | None: ...

    def finish(
        self,
        layout: InstanceLayout,
        session_id: str,
        session: Session,
        success: Sequence[bool],
        sizes: Sequence[int],
        force_fail: bool,
        mark_clear: MarkClearing | None = None,
        release_guard: CopyGuard | None = None,
    ) -> FinishOutcome: ...

    def mark_deleting(
        self,
        layout: InstanceLayout,
        block_keys: Sequence[int],
        sizes: Sequence[int],
        expected_locations: Sequence[int] | None,
        serving_only: bool,
        max_children: Sequence[int] | None,
        resubmit_before_s: int,
        delay_ms: int,
        lost_only: bool,
    ) -> list[Victim]: ...

    def restore(self, layout: InstanceLayout, victims: Sequence[Victim], sizes: Sequence[int]) -> int: ...

    def drop(self, layout: InstanceLayout, victims: Sequence[Victim], sizes: Sequence[int]) -> DropOutcome: ...

    def forget(self, layout: InstanceLayout, block_keys: Sequence[int], location_ids: Sequence[int]) -> int: ...

    def occupied_page(self, layout: InstanceLayout, cursor: int, count: int) -> tuple[int, list[int]]: ...

    def drop_all(self, layout: InstanceLayout) -> None: ...

    def charge_group(self, layout: InstanceLayout, delta: Usage, sign: int = 1, pipe: Any = None) -> None: ...

    def queue_session_deadline(self, pipe: Any, instance_id: str, deadline_ms: int) -> None: ...

    def assign_storage(self, layout: InstanceLayout, name: str, storage_type: str) -> tuple[int, int]: ...

    def claim_key_space(
        self,
        layout: InstanceLayout,
        registering: bool,
        wanted_shards: str = "",
        others_hold: bool = False,
        first_location_id: int = 0,
    ) -> tuple[int, ClaimOutcome, bytes | None]: ...


class ShardedIndex:
    """The calls of ``BlockIndex`` for a layout of several shards."""

    def __init__(self, index: ShardPrimitives) -> None:
        self.index = index
        #: (tag, suffixes, storage name) whose storage index every shard has (``ensure_storage``).
        self._storages: set[tuple[bytes, tuple[int, ...], str]] = set()

    # ---------------------------------------------------------------- reads

    def read_raw(
        self,
        layout: InstanceLayout,
        block_keys: Sequence[int],
        mode: int,
        sw_size: int,
        servable: Sequence[str] | None,
        covered: Sequence[bool] | None,
    ) -> list[bytes | None]:
        """``BlockIndex.read_raw`` over the shards: each reads its keys (a prefix read stops
        at its own first miss, at or past the prefix's end; a window read reads them all),
        the prefix or the window is found here among the merged positions."""
        parts = [(s, pos) for s, pos in enumerate(shard_positions(block_keys, layout.shard_count)) if pos]
        shard_mode = ReadMode.BATCH if mode == ReadMode.WINDOW else mode
        replies = gather(
            [
                partial(
                    self.index.read_raw,
                    layout.shards[s],
                    [block_keys[i] for i in pos],
                    shard_mode,
                    0,
                    servable,
                    [covered[i] for i in pos] if covered else None,
                )
                for s, pos in parts
            ]
        )
        merged: list[bytes | None] = [None] * len(block_keys)
        for (_, pos), reply in zip(parts, replies, strict=True):
            for i, raw in zip(pos, reply, strict=False):  # a prefix reply stops at its shard's miss
                merged[i] = raw
        if mode == ReadMode.PREFIX:
            for i, raw in enumerate(merged):
                if raw is None and not (covered and covered[i]):
                    return merged[:i]
            return merged
        if mode == ReadMode.WINDOW:
            window = rightmost_window(
                [raw is not None or bool(covered and covered[i]) for i, raw in enumerate(merged)], sw_size
            )
            return [raw if i in window else None for i, raw in enumerate(merged)]
        return merged

    # ---------------------------------------------------------------- writes

    def start(self, layout: InstanceLayout, block_keys: Sequence[int], req: StartRequest) -> StartOutcome:
        """``BlockIndex.start`` over the shards: one start script per shard holding keys,
        the same session id in each, the instance's own quotas split per shard
        (``share``). If one refuses, the sessions the others granted are failed and their
        locations dropped (nothing is prepared on storage before the whole start
        returns), and the refusal is raised."""
        index = self.index
        for name, type_name in [
            (req.storage_name, req.storage_type),
            *((c.name, c.storage_type) for c in req.more_candidates),
        ]:
            self.ensure_storage(layout, name, type_name)
        count = layout.shard_count
        parts = [(s, pos) for s, pos in enumerate(shard_positions(block_keys, count)) if pos] or [(0, [])]
        requests = [
            replace(
                req,
                spec_groups=[req.spec_groups[i] for i in pos],
                explicit_groups=[req.explicit_groups[i] for i in pos] if req.explicit_groups else (),
                stale=[(k, loc) for k, loc in req.stale if shard_of(k, count) == s],
                instance_capacity=share(req.instance_capacity, count, s),
                max_keys=share(req.max_keys, count, s),
                # Shards grant independently: a leading run across them is not one script's.
                partial=False,
                positions=pos,
            )
            for s, pos in parts
        ]
        settled = settle(
            [
                partial(index.grant, layout.shards[s], [block_keys[i] for i in pos], sub)
                for (s, pos), sub in zip(parts, requests, strict=True)
            ]
        )
        granted = [
            (s, pos, sub, outcome)
            for (s, pos), sub, (outcome, _) in zip(parts, requests, settled, strict=True)
            if outcome is not None
        ]
        total = sum((outcome.charge(req.storage_type) for *_, outcome in granted), Usage())
        errors = [exc for _, exc in settled if exc is not None]
        if errors:
            index.charge_group(layout, total)  # the failures below release it
            self.fail_parts(layout, req.session_id, req.sizes, [s for s, *_ in granted])
            raise first_refusal(errors)
        pack_counts = [req.pack_count, *(c.pack_count for c in req.more_candidates)]
        written_to = [0] * len(block_keys)
        placed: dict[int, tuple[int, int, int]] = {}
        pipe = index.client.pipeline(transaction=False)
        index.charge_group(layout, total, pipe=pipe)
        if any(any(outcome.new_flags) for *_, outcome in granted):  # sessions were opened
            index.queue_session_deadline(pipe, layout.instance_id, req.deadline_ms)
        for _, pos, sub, outcome in granted:
            shard_written = [
                (local, outcome.written_to[local] if outcome.written_to else 1)
                for local, new in enumerate(outcome.new_flags)
                if new
            ]
            for (local, candidate), where in zip(
                shard_written, outcome.placements_of(shard_written, pack_counts, sub.explicit_groups), strict=True
            ):
                written_to[pos[local]] = candidate
                placed[pos[local]] = where
        outcomes = [outcome for *_, outcome in granted]
        # A shard that routed or cleared Marks read its own count: the instance's is every shard's.
        marks_moved = any(o.marks.active is not None for o in outcomes)
        if marks_moved:
            queue_marks(pipe, layout)
        replies: list[Any] = []
        if len(pipe):
            with valkey_errors("index"):
                replies = pipe.execute()
        marks = MarkCounts(
            routed=sum(o.marks.routed for o in outcomes),
            expired=sum(o.marks.expired for o in outcomes),
            malformed=sum(o.marks.malformed for o in outcomes),
            active=summed_marks(replies[-count:]) if marks_moved else None,
        )
        placements = tuple(placed[i] for i in sorted(placed))
        bytes_by_type: dict[str, int] = {}
        for *_, outcome in granted:
            for type_name, added in (outcome.bytes_by_type or {req.storage_type: outcome.new_bytes}).items():
                bytes_by_type[type_name] = bytes_by_type.get(type_name, 0) + added
        return StartOutcome(
            placements[0][0] if placements else 0,
            [c > 0 for c in written_to],
            outcomes[0].storage_index,
            sum(o.new_bytes for o in outcomes),
            placements,
            written_to=tuple(written_to),
            storage_indexes=tuple(max(found) for found in zip(*(o.storage_indexes for o in outcomes), strict=True))
            if outcomes[0].storage_indexes
            else (),
            created=sum(sum(o.new_flags) if o.created is None else o.created for o in outcomes),
            bytes_by_type={t: b for t, b in bytes_by_type.items() if b},
            victims=tuple(v for o in outcomes for v in o.victims),
            pruned=sum((o.pruned for o in outcomes), Usage()),
            marks=marks,
        )

    def marks_active(self, layout: InstanceLayout) -> int:
        """The instance's Marks, summed over its shards (one round trip)."""
        pipe = self.index.client.pipeline(transaction=False)
        queue_marks(pipe, layout)
        with valkey_errors("index"):
            return summed_marks(pipe.execute())

    def fail_parts(self, layout: InstanceLayout, session_id: str, sizes: Sequence[int], shards: Sequence[int]) -> None:
        """Fail a session's parts in ``shards`` and drop their locations (a start or a
        Copy refused in another shard: nothing was written to storage for them yet)."""
        index = self.index

        def fail(shard: InstanceLayout) -> None:
            session = index.session(shard, session_id)
            if session is not None:
                failed = index.finish(shard, session_id, session, (), sizes, force_fail=True)
                index.drop(shard, failed.victims, sizes)

        gather([partial(fail, layout.shards[s]) for s in shards])

    def ensure_storage(self, layout: InstanceLayout, name: str, storage_type: str) -> None:
        """Give ``name`` its storage index in shard 0 and copy it to the others, once per
        process and instance: start.lua would otherwise number storages per shard, and a
        record's storage index must mean one storage whichever shard it is read from."""
        known = (layout.tag, layout.shard_suffixes, name)
        if known in self._storages:
            return
        first = layout.shards[0]
        index = self.index
        assigned, sidx = index.assign_storage(first, name, storage_type)
        pipe = index.client.pipeline(transaction=False)
        for shard in layout.shards[1:]:
            pipe.hset(shard.key("m"), "storages", assigned)
            if sidx:
                pipe.hset(shard.key("st"), mapping={f"n:{name}": sidx, f"#{sidx}": name, f"t{sidx}": storage_type})
        with valkey_errors("index"):
            pipe.execute()
        if sidx:
            self._storages.add(known)

    def session(self, layout: InstanceLayout, session_id: str) -> ShardedSession | None:
        """The session's parts in every shard, one round trip; None when no shard has it."""
        pipe = self.index.client.pipeline(transaction=False)
        for shard in layout.shards:
            pipe.hmget(shard.session(session_id), "d", "k", "o")
        with valkey_errors("index"):
            replies = pipe.execute()
        parts: list[tuple[int, Session]] = []
        keyed: list[tuple[int, int, int]] = []  # (request position, part, index in part)
        ordered = True
        for s, (deadline, raw, positions) in enumerate(replies):
            if deadline is None:
                continue
            entries = session_entries(raw or b"")
            if entries and (positions is None or len(positions) != REQUEST_POSITION.size * len(entries)):
                ordered = False
                positions = b"".join(REQUEST_POSITION.pack(len(keyed) + j) for j in range(len(entries)))
            width, part = REQUEST_POSITION.size, len(parts)
            keyed += [(REQUEST_POSITION.unpack_from(positions, j * width)[0], part, j) for j in range(len(entries))]
            parts.append((s, Session(int(deadline), entries, raw or b"")))
        if not parts:
            return None
        keyed.sort()
        entries = [parts[p][1].entries[j] for _, p, j in keyed]
        return ShardedSession(
            min(part.deadline_ms for _, part in parts),
            entries,
            b"",
            tuple(parts),
            tuple((p, j) for _, p, j in keyed),
            ordered,
        )

    def finish(
        self,
        layout: InstanceLayout,
        session_id: str,
        session: Session,
        success: Sequence[bool],
        sizes: Sequence[int],
        force_fail: bool,
        mark_clear: MarkClearing | None = None,
        release_guard: CopyGuard | None = None,
    ) -> FinishOutcome:
        """``BlockIndex.finish`` over the session's parts, at once."""
        if not isinstance(session, ShardedSession):
            raise WriteSessionError(f"write session {session_id!r} was not read from the instance's shards")
        if not force_fail:
            if len(success) != len(session.entries):
                raise WriteSessionError(
                    f"field 'success_blocks': the session has {len(session.entries)} blocks, the mask {len(success)}"
                )
            if not session.ordered:
                raise WriteSessionError(f"write session {session_id!r} lost the order of its blocks; it will expire")
        masks: list[list[bool]] = [[False] * len(part.entries) for _, part in session.parts]
        if not force_fail:
            for flag, (p, j) in zip(success, session.origin, strict=True):
                masks[p][j] = flag
        settled = settle(
            [
                partial(
                    self.index.finish,
                    layout.shards[s],
                    session_id,
                    part,
                    masks[p],
                    sizes,
                    force_fail,
                    mark_clear,
                    release_guard,
                )
                for p, (s, part) in enumerate(session.parts)
            ]
        )
        errors = [exc for _, exc in settled if exc is not None]
        if errors:
            raise errors[0]
        replies = [reply for reply, _ in settled if reply is not None]
        position = {where: i for i, where in enumerate(session.origin)}
        uncommitted = sorted(
            position[(p, j)] for p, reply in enumerate(replies) for j in reply.uncommitted if (p, j) in position
        )
        # A part may expire while another closes in time: the positions of each expired part.
        lapsed = sorted(
            position[(p, j)]
            for p, reply in enumerate(replies)
            if reply.expired
            for j in range(len(session.parts[p][1].entries))
            if (p, j) in position
        )
        consumed = sum(r.marks.consumed for r in replies)
        # Each shard counts its own Marks: the instance's are read from every shard after.
        marks = MarkCounts(consumed=consumed, active=self.marks_active(layout) if consumed else None)
        return FinishOutcome(
            any(r.expired for r in replies), [v for r in replies for v in r.victims], uncommitted, lapsed, marks
        )

    def mark_deleting(
        self,
        layout: InstanceLayout,
        block_keys: Sequence[int],
        sizes: Sequence[int],
        expected_locations: Sequence[int] | None,
        serving_only: bool,
        max_children: Sequence[int] | None,
        resubmit_before_s: int,
        delay_ms: int,
        lost_only: bool,
    ) -> list[Victim]:
        """``BlockIndex.mark_deleting`` per shard, at once."""
        parts = [(s, pos) for s, pos in enumerate(shard_positions(block_keys, layout.shard_count)) if pos]
        replies = gather(
            [
                partial(
                    self.index.mark_deleting,
                    layout.shards[s],
                    [block_keys[i] for i in pos],
                    sizes,
                    [expected_locations[i] for i in pos] if expected_locations else None,
                    serving_only,
                    [max_children[i] for i in pos] if max_children else None,
                    resubmit_before_s,
                    delay_ms,
                    lost_only,
                )
                for s, pos in parts
            ]
        )
        return [v for victims in replies for v in victims]

    def restore(self, layout: InstanceLayout, victims: Sequence[Victim], sizes: Sequence[int]) -> int:
        """``BlockIndex.restore`` per shard, at once."""
        per_shard: list[list[Victim]] = [[] for _ in layout.shards]
        for victim in victims:
            per_shard[shard_of(victim.block_key, layout.shard_count)].append(victim)
        return sum(
            gather(
                [partial(self.index.restore, layout.shards[s], part, sizes) for s, part in enumerate(per_shard) if part]
            )
        )

    def drop(self, layout: InstanceLayout, victims: Sequence[Victim], sizes: Sequence[int]) -> DropOutcome:
        """``BlockIndex.drop`` per shard, at once."""
        per_shard: list[list[Victim]] = [[] for _ in layout.shards]
        for victim in victims:
            per_shard[shard_of(victim.block_key, layout.shard_count)].append(victim)
        replies = gather(
            [partial(self.index.drop, layout.shards[s], part, sizes) for s, part in enumerate(per_shard) if part]
        )
        return DropOutcome(
            sum(r.dropped for r in replies),
            [g for r in replies for g in r.orphan_groups],
            sum((r.freed for r in replies), Usage()),
        )

    def forget(self, layout: InstanceLayout, block_keys: Sequence[int], location_ids: Sequence[int]) -> int:
        """``BlockIndex.forget`` per shard, at once."""
        parts = [(s, pos) for s, pos in enumerate(shard_positions(block_keys, layout.shard_count)) if pos]
        return sum(
            gather(
                [
                    partial(
                        self.index.forget,
                        layout.shards[s],
                        [block_keys[i] for i in pos],
                        [location_ids[i] for i in pos],
                    )
                    for s, pos in parts
                ]
            )
        )

    # ---------------------------------------------------------------- occupied buckets

    def occupied_page(self, layout: InstanceLayout, cursor: int, count: int) -> tuple[int, list[int]]:
        """One page of one shard's occupied buckets; the cursor walks the shards in turn
        (its low bits name the shard, the rest is that shard's SSCAN cursor)."""
        shard = cursor & ((1 << _CURSOR_SHARD_BITS) - 1)
        position, buckets = self.index.occupied_page(layout.shards[shard], cursor >> _CURSOR_SHARD_BITS, count)
        buckets = [b | (shard << SHARD_BUCKET_SHIFT) for b in buckets]
        if position:
            return (position << _CURSOR_SHARD_BITS) | shard, buckets
        shard += 1
        return (0 if shard == layout.shard_count else shard), buckets

    def occupied_sample(self, layout: InstanceLayout, count: int) -> tuple[int, list[int]]:
        """``BlockIndex.occupied_sample`` over the union of the shards' occupied buckets:
        each shard contributes in proportion to its occupied buckets, so the sample is
        uniform over the instance (one round trip)."""
        pipe = self.index.client.pipeline(transaction=False)
        for shard in layout.shards:
            pipe.scard(shard.occupied)
            pipe.srandmember(shard.occupied, count)
        with valkey_errors("index"):
            replies = pipe.execute()
        sizes = [int(n) for n in replies[0::2]]
        members = [[int(m) | (s << SHARD_BUCKET_SHIFT) for m in found] for s, found in enumerate(replies[1::2])]
        total = sum(sizes)
        if total <= count:
            return total, [m for found in members for m in found]
        taken = [0] * len(sizes)
        left = list(sizes)
        for _ in range(count):  # draws without replacement, shard by shard
            s = random.choices(range(len(left)), weights=left)[0]
            taken[s] += 1
            left[s] -= 1
        return total, [m for s, found in enumerate(members) for m in found[: taken[s]]]

    # ---------------------------------------------------------------- key space

    def stored_layouts(self, instance_ids: Sequence[str]) -> list[InstanceLayout]:
        """The shard layout each instance's key space holds (lua/claim.lua), one round trip
        (bucket bits left 0: enough to name sessions, usage and occupied sets)."""
        pipe = self.index.client.pipeline(transaction=False)
        for instance_id in instance_ids:
            pipe.hget(InstanceLayout(self.index.prefix, instance_id, 0).key("m"), "sfx")
        with valkey_errors("index"):
            stored = pipe.execute()
        return [
            InstanceLayout(self.index.prefix, instance_id, 0, shard_suffixes=parse_suffixes(sfx))
            for instance_id, sfx in zip(instance_ids, stored, strict=True)
        ]

    def others_hold(self, instance_id: str) -> bool:
        """Whether a shard other than 0 of the instance's stored layout holds blocks."""
        layout = self.stored_layouts([instance_id])[0]
        if not layout.shard_suffixes:
            return False
        pipe = self.index.client.pipeline(transaction=False)
        for shard in layout.shards[1:]:
            pipe.scard(shard.occupied)
        with valkey_errors("index"):
            return any(int(n) for n in pipe.execute())

    def pick_suffixes(self, instance_id: str, shard_count: int) -> tuple[int, ...]:
        """Hash-tag suffixes for shards 1.. of a new key space: on a cluster, the first
        numbers whose slots fall on the masters holding fewest of the instance's shards
        (shard 0's master counts one); on one node, 1..k-1."""
        if shard_count <= 1:
            return ()
        client = self.index.client
        if not isinstance(client, RedisCluster):
            return tuple(range(1, shard_count))

        def master(suffix: int | None) -> str:
            tag = f"{{{self.index.prefix}:{instance_id}" + ("" if suffix is None else f"#{suffix}") + "}"
            return client.nodes_manager.get_node_from_slot(client.keyslot(tag)).name

        load = {node.name: 0 for node in client.get_primaries()}
        load[master(None)] = load.get(master(None), 0) + 1
        chosen: list[int] = []
        candidate = 0
        while len(chosen) < shard_count - 1:
            candidate += 1
            node = master(candidate)
            if load.get(node, 0) == min(load.values()) or candidate > 1 << 16:
                chosen.append(candidate)
                load[node] = load.get(node, 0) + 1
        return tuple(chosen)

    def claim_shards(self, layout: InstanceLayout) -> None:
        """Bind shards 1.. to the incarnation shard 0 took (lua/claim.lua), with shard 0's
        bucket bits and each its own range of location ids."""
        index = self.index
        for ordinal, shard in enumerate(layout.shards[1:], 1):
            for _ in range(2):
                _, outcome, _ = index.claim_key_space(
                    shard, registering=True, first_location_id=ordinal << LOCATION_ID_SHARD_SHIFT
                )
                if outcome != ClaimOutcome.OCCUPIED:
                    break
                index.drop_all(shard)  # an earlier registration's blocks in this shard
