"""The index side of a tiered Copy (UPSTREAM_V2 §2.11 "Copy"; docs/tiered-storage.md).

1. ``begin_copy``: one atomic step (lua/migrate_begin.lua) that checks each block's source
   location is still SERVING, that the target storage does not hold the block already and
   that the quotas allow the bytes, then gives each taken block a WRITING location on the
   target, in a write session of its own, with the usage counters moved in the same step.
2. The caller copies the bytes (``storage.copy.copy_blocks``) to the target placements.
3. ``finish_copy``: lua/finish.lua turns each target SERVING only while its source location
   is still SERVING (the session remembers it), and every other target DELETING, to be
   deleted. A caller that dies between the steps leaves a session that expires: the reaper
   fails it like any write session, so no target stays WRITING.

An instance spread over shards begins a Copy as sharding.py starts a write: one script per
shard holding sources, at once, the same session id in each (its part in each shard, with
the sources' call positions in 'o'), the instance's byte quota split per shard (``share``),
and if one shard refuses, the parts the others made are failed and dropped before the
refusal is raised. ``finish_copy`` closes every part (``ShardedIndex.finish``).

Mark (UPSTREAM_V2 §2.11 "Mark"): ``mark`` stores {target storage, expiry} at the end of
each block's record in one atomic step (lua/migrate_mark.lua); the block's next
startWriteCache writes it to the target (lua/start.lua), and the finish of a write or Copy
there clears the Mark (lua/finish.lua, the group's ``mark_clear_policy``).

Marking the blocks of an instance spread over shards is not supported yet (the target's
storage index would have to be given to every shard first): UnsupportedError.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from ..protocol.errors import UnsupportedError
from ..valkey import valkey_errors
from .block_index import BlockIndex
from .errors import InstanceGoneError, QuotaExceededError, WriteSessionError
from .layout import REQUEST_POSITION, SESSION_ENTRY, StartRefusal, StartResult
from .records import Victim
from .scripts import load_script
from .sharding import settle, shard_of, share
from .types import InstanceLayout, MarkClearing, MarkCounts, Usage, pack_keys, pack_u48


@dataclass(frozen=True)
class CopyTarget:
    """The storage a Copy writes to, as the start script's candidates describe one."""

    storage_name: str
    storage_type: str
    pack_count: int
    #: Whether it addresses blocks by location (a key may have several there).
    by_location: bool
    #: The quota of its storage type (0: none).
    type_capacity: int = 0


@dataclass(frozen=True)
class CopyQuotas:
    """The quotas a Copy's bytes count against, and the group's live usage as last read."""

    group_capacity: int = 0
    instance_capacity: int = 0
    #: None: not read (only this instance's usage counts).
    group_usage: Usage | None = None


@dataclass(frozen=True)
class CopyBegun:
    """What ``begin_copy`` took."""

    session_id: str
    #: Per source, in order: "1" taken, "g" source gone (not SERVING), "c" the target holds it.
    outcomes: str
    #: (block key, source location id, target location id, group id, slot) of each taken block.
    placements: tuple[tuple[int, int, int, int, int], ...]
    target_storage_index: int
    bytes_added: int


@dataclass(frozen=True)
class CopyFinished:
    """What ``finish_copy`` did, by position among the session's taken blocks."""

    served: tuple[int, ...]
    failed: tuple[int, ...]
    #: The failed targets, now DELETING, for deletion.
    victims: tuple[Victim, ...]
    #: The Marks for the target the served ones cleared.
    marks: MarkCounts = MarkCounts()


@dataclass(frozen=True)
class MarkResult:
    """What ``mark`` did."""

    #: Per key, in order: "1" marked, "g" no SERVING location (or no record), "c" the
    #: target holds it already (or the key was named before in the call).
    outcomes: str
    #: The instance's Marks after the call.
    active: int

    @property
    def accepted(self) -> int:
        return self.outcomes.count("1")

    @property
    def rejected(self) -> int:
        return len(self.outcomes) - self.accepted


class MigrationIndex:
    """Copy's steps on the block index (``index``'s client, prefix and clock)."""

    def __init__(self, index: BlockIndex) -> None:
        self.index = index
        self._begin = index.client.register_script(load_script("migrate_begin"))
        self._mark = index.client.register_script(load_script("migrate_mark"))

    def mark(
        self,
        layout: InstanceLayout,
        block_keys: Sequence[int],
        target_name: str,
        target_type: str,
        expiry_ms: int,
        covers: bytes = b"",
        spec_group_count: int = 1,
    ) -> MarkResult:
        """Mark each block with a SERVING location for ``target_name`` until ``expiry_ms``
        (a Mark there is replaced), unless the target holds it already: one atomic step.
        ``covers`` as StartRequest's. UnsupportedError for a sharded instance."""
        if layout.shard_suffixes:
            raise UnsupportedError(f"instance '{layout.instance_id}' is sharded: Mark does not cover it yet")
        reply = self.index._call(
            self._mark,
            [layout.key("m"), layout.key("u"), layout.key("st")],
            [
                pack_keys(block_keys),
                layout.bucket_prefix,
                target_name,
                target_type,
                expiry_ms,
                covers,
                spec_group_count,
                layout.incarnation,
            ],
        )
        if reply[0] == StartResult.REFUSED:
            if StartRefusal(reply[1].decode()) == StartRefusal.GONE:
                raise InstanceGoneError(f"instance '{layout.instance_id}' is being removed or was registered again")
            raise QuotaExceededError(
                StartRefusal.STORAGES,
                f"the instance has written to 255 storages, the most it can address; {target_name} is not one of them",
                0,
                target_type,
            )
        return MarkResult(reply[1].decode(), int(reply[2]))

    def begin_copy(
        self,
        layout: InstanceLayout,
        sources: Sequence[tuple[int, int]],
        target: CopyTarget,
        sizes: Sequence[int],
        session_id: str,
        deadline_ms: int,
        quotas: CopyQuotas | None = None,
        covers: bytes = b"",
        spec_group_count: int = 1,
        demoted_type: str = "",
    ) -> CopyBegun:
        """WRITING target locations for the (block key, source location id) pairs that may
        be copied, all or nothing under the quotas (QuotaExceededError). ``sizes``: block
        bytes per spec group; ``covers`` as StartRequest's. On a sharded instance, one step
        per shard holding sources, the instance's quota split per shard (``share``).
        ``demoted_type``: a reclaim's demote of sources of that storage type, whose bytes
        count in the instance's ``Usage.demoting_by_type`` until the session closes."""
        quotas = quotas or CopyQuotas()
        shard = partial(
            self._begin_shard,
            target=target,
            sizes=sizes,
            session_id=session_id,
            deadline_ms=deadline_ms,
            quotas=quotas,
            covers=covers,
            spec_group_count=spec_group_count,
            demoted_type=demoted_type,
        )
        if not layout.shard_suffixes:
            parts = [(list(range(len(sources))), shard(layout, sources, quotas.instance_capacity, ()))]
        else:
            parts = self._begin_shards(layout, sources, target, sizes, session_id, quotas, shard)
        outcomes = [""] * len(sources)
        placed: dict[int, tuple[int, int, int, int, int]] = {}
        for positions, part in parts:
            taken = [i for i, outcome in zip(positions, part.outcomes, strict=True) if outcome == "1"]
            placed |= dict(zip(taken, part.placements, strict=True))
            for i, outcome in zip(positions, part.outcomes, strict=True):
                outcomes[i] = outcome
        added = sum(part.bytes_added for _, part in parts)
        if added:
            pipe = self.index.client.pipeline(transaction=False)
            self.index.charge_group(layout, _charge(target, added), pipe=pipe)
            self.index.queue_session_deadline(pipe, layout.instance_id, deadline_ms)
            with valkey_errors("index"):
                pipe.execute()
        return CopyBegun(
            session_id,
            "".join(outcomes),
            tuple(placed[i] for i in sorted(placed)),
            max(part.target_storage_index for _, part in parts),
            added,
        )

    def _begin_shards(
        self,
        layout: InstanceLayout,
        sources: Sequence[tuple[int, int]],
        target: CopyTarget,
        sizes: Sequence[int],
        session_id: str,
        quotas: CopyQuotas,
        shard: Callable[[InstanceLayout, Sequence[tuple[int, int]], int, Sequence[int]], CopyBegun],
    ) -> list[tuple[list[int], CopyBegun]]:
        """One begin per shard holding sources, at once: (call positions, what it took) per
        shard. If one refuses, the others' parts are failed and dropped, then its error is raised."""
        sharded = self.index.sharded
        # The target's storage index must mean one storage in every shard.
        sharded.ensure_storage(layout, target.storage_name, target.storage_type)
        count = layout.shard_count
        by_shard: list[list[int]] = [[] for _ in range(count)]
        for i, (key, _) in enumerate(sources):
            by_shard[shard_of(key, count)].append(i)
        parts = [(s, pos) for s, pos in enumerate(by_shard) if pos] or [(0, [])]
        settled = settle(
            [
                partial(
                    shard,
                    layout.shards[s],
                    [sources[i] for i in pos],
                    share(quotas.instance_capacity, count, s),
                    pos,
                )
                for s, pos in parts
            ]
        )
        errors = [exc for _, exc in settled if exc is not None]
        if errors:
            granted = [(s, begun) for (s, _), (begun, _) in zip(parts, settled, strict=True) if begun is not None]
            # Charged first, as a start's grants are: failing and dropping the parts releases it.
            self.index.charge_group(layout, _charge(target, sum(begun.bytes_added for _, begun in granted)))
            sharded.fail_parts(layout, session_id, sizes, [s for s, _ in granted])
            raise next((e for e in errors if isinstance(e, InstanceGoneError)), errors[0])
        return [(pos, begun) for (_, pos), (begun, _) in zip(parts, settled, strict=True) if begun is not None]

    def _begin_shard(
        self,
        layout: InstanceLayout,
        sources: Sequence[tuple[int, int]],
        instance_capacity: int,
        positions: Sequence[int],
        *,
        target: CopyTarget,
        sizes: Sequence[int],
        session_id: str,
        deadline_ms: int,
        quotas: CopyQuotas,
        covers: bytes,
        spec_group_count: int,
        demoted_type: str,
    ) -> CopyBegun:
        """lua/migrate_begin.lua on one hash tag (the caller moves the group's counters)."""
        group = quotas.group_usage
        reply = self.index._call(
            self._begin,
            [
                layout.key("m"),
                layout.key("u"),
                layout.key("st"),
                layout.key("g"),
                layout.key("sd"),
                layout.session(session_id),
            ],
            [
                b"".join(SESSION_ENTRY.pack(k.to_bytes(8, "big", signed=True), loc) for k, loc in sources),
                int(self.index.clock.now() * 1000),
                session_id,
                deadline_ms,
                target.storage_name,
                target.storage_type,
                target.pack_count,
                pack_u48(sizes),
                quotas.group_capacity,
                -1 if group is None else group.bytes,
                target.type_capacity,
                -1 if group is None else group.by_type.get(target.storage_type, 0),
                instance_capacity,
                layout.bucket_prefix,
                layout.incarnation,
                layout.instance_id,
                covers,
                spec_group_count,
                "1" if target.by_location else "0",
                b"".join(REQUEST_POSITION.pack(p) for p in positions),
                demoted_type,
            ],
        )
        if reply[0] == StartResult.REFUSED:
            reason = StartRefusal(reply[1].decode())
            if reason == StartRefusal.GONE:
                raise InstanceGoneError(f"instance '{layout.instance_id}' is being removed or was registered again")
            raise QuotaExceededError(
                reason,
                f"a copy to {target.storage_name} would pass a quota ({reason.name.lower()})",
                int(reply[2]) if len(reply) > 2 else 0,
                target.storage_type,
            )
        base, outcomes, added = int(reply[1]), reply[2].decode(), int(reply[4])
        taken = [src for src, outcome in zip(sources, outcomes, strict=True) if outcome == "1"]
        pack = target.pack_count
        placements = tuple(
            (key, source, base + j, (base + j - j % pack) if pack > 0 else 0, j % pack if pack > 0 else 0)
            for j, (key, source) in enumerate(taken)
        )
        return CopyBegun(session_id, outcomes, placements, int(reply[3]), added)

    def finish_copy(
        self,
        layout: InstanceLayout,
        session_id: str,
        copied: Sequence[bool],
        sizes: Sequence[int],
        mark_clear: MarkClearing | None = None,
    ) -> CopyFinished:
        """Close a Copy's session (positions are its taken blocks, in order): a target whose
        bytes were copied (``copied``) turns SERVING while its source is still SERVING (and
        clears a Mark for the target as ``mark_clear`` says: §2.11 step 5); every other one
        turns DELETING and is returned for deletion. WriteSessionError when the session is
        gone (finished, or expired and reaped)."""
        session = self.index.session(layout, session_id)
        if session is None:
            raise WriteSessionError(f"copy session {session_id!r} is unknown, finished or expired")
        outcome = self.index.finish(layout, session_id, session, copied, sizes, mark_clear=mark_clear)
        failed = set(outcome.lapsed) | set(outcome.uncommitted)
        failed |= {j for j, ok in enumerate(copied) if not ok}
        served = tuple(j for j in range(len(copied)) if j not in failed)
        return CopyFinished(served, tuple(sorted(failed)), tuple(outcome.victims), outcome.marks)


def _charge(target: CopyTarget, added: int) -> Usage:
    """What a Copy's targets add to the counters: bytes, no keys (no record is created)."""
    return Usage(added, 0, {target.storage_type: added})
