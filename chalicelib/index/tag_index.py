"""Valkey access for the blocks, write sessions and usage of one hash tag: one script call
per operation (``BlockIndex`` picks this or ``ShardedIndex`` per instance layout).

Layout per instance (every key shares the hash tag ``{<prefix>:<instance>}``, so an
instance's blocks, sessions and counters live on one cluster slot and move together in
one Lua call):

- ``T:b:<bucket>`` hashes of block records; bucket = low bits of the block key (scripts
  derive it, so a call packs one blob of keys rather than one argument per block). The
  buckets grow with the records, a split at a time (linear hashing: ``bucket_index``,
  lua/prelude.lua ``grow_buckets``), so that each keeps about ``RECORDS_PER_BUCKET``
  records and stays in Valkey's compact listpack encoding whatever the instance holds;
- ``T:ob`` the occupied buckets (integer members), so that scans, sampling and removal
  cost what the instance holds, never the buckets it was sized for;
- ``T:m`` counters (location ids, storage indexes) and the bucket count (``n``; without
  it, the ``2^bits`` the key space was registered with); ``T:u`` usage (bytes, keys, bytes per
  storage type ``t:<type>`` and per storage ``s:<name>``, and the part of bytes, keys
  and type bytes that is DELETING: ``d``, ``dk``, ``dt:<type>``); ``T:st`` storage index table;
- ``T:g`` live-block counts of packed groups (files), ``T:og`` groups whose files await
  deletion; ``T:fg`` locations forgotten by a metadata-only trim (VICTIM members), whose
  data stays on storage, charged, until the instance's removal deletes it;
  ``T:s:<session>`` write sessions and ``T:sd`` their deadlines; ``T:pd`` the DELETING
  locations (key, location id) scored by when their hand-off counts as lost.

``{<prefix>:deletions}:due`` names, for every instance with pending deletions, the times
they fall due (members ``<time>:<instance>``, added before a script marks): the recovery
of lost deletions (capacity/stranded.py) reads what is due, never every instance.

Per instance group, ``{<prefix>:grp:<group>}:u`` sums the usage of its instances (same
fields). Instances live on other slots than their group, so it moves right after each
script that changes an instance's usage (same pipeline as nothing else: one extra round
trip only when something changed); starts read it instead of every peer's usage.
"""

from __future__ import annotations

import math
import random
import struct
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, cast

import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError
from redis.typing import EncodableT, KeyT

from ..clock import Clock
from ..observability.hit_feed import STREAM_SUFFIX, FeedEntry
from ..resp import command, replies
from ..valkey import Deferred, Valkey, exchange, follow_moved, valkey_errors
from .errors import CopyGuardError, InstanceGoneError, QuotaExceededError, WriteSessionError
from .layout import (
    REQUEST_POSITION,
    SESSION_ENTRY,
    ClaimOutcome,
    CopyGuard,
    FinishStatus,
    MarkScope,
    ReadMode,
    StartRefusal,
    StartResult,
)
from .reads import Recency, answer, blocked_storages, bucket_count_of, bucket_names, read_command
from .records import Victim, decode_victims, encode_victims
from .scripts import (
    START_ARGS,
    START_CANDIDATE_ARGS,
    START_GRANT,
    START_KEYS,
    START_REFUSAL,
    START_TAIL_ARGS,
    load_script,
)
from .types import (
    DropOutcome,
    FinishOutcome,
    InstanceLayout,
    MarkClearing,
    MarkCounts,
    RawHash,
    Session,
    StartOutcome,
    StartRequest,
    Usage,
    pack_keys,
    pack_u48,
    packed_groups,
    session_entries,
)


def _start_marks(reply: bytes) -> MarkCounts:
    """lua/start.lua's marks field: routed, expired, malformed, the instance's Marks after (0: not read)."""
    routed, expired, malformed, active = (int(x) for x in reply.split(b","))
    changed = routed or expired or malformed
    return MarkCounts(routed=routed, expired=expired, malformed=malformed, active=active if changed else None)


class TagIndex:
    """Every read and state change of the block records, usage and write sessions under one
    hash tag, and the service-wide sets those changes feed (group usage, due sets, queues)."""

    #: A served block's recency is refreshed at most once per this many seconds.
    TOUCH_INTERVAL_S = 1
    #: LFU counters lose one per this many seconds without access.
    LFU_DECAY_S = 60
    #: A location DELETING this much longer than its group's delete delay counts as a lost
    #: deletion (its hand-off failed) and may be handed to deletion again. Any sooner, a
    #: second deletion could overlap the first, and for storages naming objects by block
    #: key alone the late one could delete the object of a block written again meanwhile.
    DELETION_LOST_AFTER_S = 600
    #: Buckets per round trip when reading many (scans, removal, migration).
    SCAN_BATCH = 64
    #: Due times in ``{<prefix>:deletions}:due`` are rounded up to this many seconds: an
    #: instance marking all the time has one member per step, not one per call.
    DUE_STEP_S = 10
    #: ``resubmit_before_s`` taking every DELETING location (a removal: nothing can write
    #: the instance again, so no deletion can hit a newer block).
    EVERY_DELETION = 1 << 52
    #: A start splits a bucket while the instance holds more than this many records per
    #: bucket (lua/prelude.lua grow_buckets). A listpack lookup scans the bucket, which a
    #: client's HGET pays little for: 16 keeps a two-spec block under 72 B (67 against 74.5
    #: at 8) for a read within noise (docs/index-read-path.md, "Reads without a script").
    RECORDS_PER_BUCKET = 16

    def __init__(self, client: Valkey, prefix: str, clock: Clock) -> None:
        self.client = client
        self.prefix = prefix
        self.clock = clock
        self._touch = client.register_script(load_script("touch"))
        self._start = client.register_script(load_script("start"))
        self._finish = client.register_script(load_script("finish"))
        self._mark = client.register_script(load_script("mark"))
        self._restore = client.register_script(load_script("restore"))
        self._drop = client.register_script(load_script("drop"))
        self._claim = client.register_script(load_script("claim"))
        self._forget = client.register_script(load_script("forget"))
        self._release = client.register_script(load_script("release"))
        self._storage = client.register_script(load_script("storage"))
        self._recount_callers = client.register_script(load_script("recount_callers"))
        #: Hash tag -> the bucket count last seen (reads name buckets with it; a read
        #: finding it out of date names them in Lua and returns the count now).
        self._bucket_counts: dict[bytes, int] = {}
        #: Connections a read sent a recency refresh on, its reply not read yet (``settle``).
        self._parked: list[tuple[Deferred, list[bytes], list[bytes | int]]] = []
        self._touch_loaded = False
        #: The LFU counters' coin (lua scripts used Valkey's math.random).
        self._rng = random.Random()

    def layout(
        self,
        instance_id: str,
        bucket_bits: int,
        group: str = "",
        incarnation: str = "",
        shard_suffixes: tuple[int, ...] = (),
    ) -> InstanceLayout:
        return InstanceLayout(self.prefix, instance_id, bucket_bits, group, incarnation, shard_suffixes)

    def _call(self, script: Script, keys: Sequence[KeyT], args: Sequence[EncodableT]) -> Any:
        self.settle()  # this process's reads refreshed before its next change (``read_raw``)
        with valkey_errors("index"):
            return script(keys=keys, args=args)

    @staticmethod
    def _queue_feed(pipe: Any, layout: InstanceLayout, entry: FeedEntry) -> None:
        """Append a hit-feed entry to the instance's stream (observability.hit_feed)."""
        pipe.xadd(layout.key(STREAM_SUFFIX), entry.fields(), maxlen=entry.max_len or None, approximate=True)

    def append_feed(self, layout: InstanceLayout, entry: FeedEntry) -> None:
        """Append a hit-feed entry on its own (a sharded instance's call has no single
        pipeline to ride on)."""
        pipe = self.client.pipeline(transaction=False)
        self._queue_feed(pipe, layout, entry)
        with valkey_errors("index"):
            pipe.execute()

    def _call_queued(
        self,
        script: Script,
        keys: Sequence[KeyT],
        args: Sequence[EncodableT],
        before: Callable[[Any], None] | None = None,
        after: Callable[[Any], None] | None = None,
    ) -> Any:
        """``_call`` in one round trip with what ``before`` queues ahead of the script and
        ``after`` behind it: one pipeline with the EVALSHA (a pipelined Script would check
        SCRIPT EXISTS first, a round trip more). A server without the script yet answers
        NOSCRIPT: the script is then called alone (``before``'s commands ran already).
        ``before``'s commands must hold once the script ran: if one failed, they are sent
        again alone (raising if they fail again) before the script's reply is used;
        ``after``'s replies are not looked at."""
        self.settle()
        pipe = self.client.pipeline(transaction=False)
        if before is not None:
            before(pipe)
        at = len(pipe)
        # execute_command: a cluster pipeline blocks its evalsha method, not the command.
        pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        if after is not None:
            after(pipe)
        with valkey_errors("index"):
            replies = pipe.execute(raise_on_error=False)
        if before is not None and any(isinstance(r, Exception) for r in replies[:at]):
            again = self.client.pipeline(transaction=False)
            before(again)
            with valkey_errors("index"):
                again.execute()
        result = replies[at]
        if isinstance(result, NoScriptError):
            return self._call(script, keys, args)
        if isinstance(result, Exception):
            with valkey_errors("index"):
                raise result
        return result

    # ---------------------------------------------------------------- group usage

    def group_usage_key(self, group: str) -> str:
        return f"{{{self.prefix}:grp:{group}}}:u"

    def group_usage(self, groups: Sequence[str]) -> list[Usage]:
        """The summed usage of several groups, in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for group in groups:
            pipe.hgetall(self.group_usage_key(group))
        with valkey_errors("index"):
            return [Usage.from_hash(raw) for raw in pipe.execute()]

    @staticmethod
    def _group_fields(usage: Usage) -> dict[str, int]:
        # Per-storage bytes are kept per instance only: no quota is set per storage.
        return {k: v for k, v in usage.fields().items() if not k.startswith("s:")}

    def charge_group(self, layout: InstanceLayout, delta: Usage, sign: int = 1, pipe: Any = None) -> None:
        """Move the group's counters by what a script just changed in the instance's (queued
        on ``pipe`` when given: the caller executes it)."""
        changes = self._group_fields(delta)
        if not layout.group or not changes:
            return
        key = self.group_usage_key(layout.group)
        own = pipe is None
        pipe = self.client.pipeline(transaction=False) if own else pipe
        for name, value in changes.items():
            pipe.hincrby(key, name, sign * value)
        if own:
            with valkey_errors("index"):
                pipe.execute()

    def forget_group(self, group: str) -> None:
        """Drop a removed group's counters."""
        with valkey_errors("index"):
            self.client.delete(self.group_usage_key(group))

    # ---------------------------------------------------------------- reads

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
        """Records for ``block_keys`` in one round trip (index/reads.py: no script), with
        ``feed`` appended to the instance's hit feed in it.

        Prefix mode stops at the first key without a SERVING location; batch and window
        modes return one entry per key; raw mode every stored record. Entries are raw
        records (None = not served). ``servable`` names the storages whose locations may
        serve (None: any). ``covered`` flags keys served from elsewhere (reported
        locations): a miss there neither ends the prefix nor breaks the window. Served
        records whose recency is due come back refreshed, and lua/touch.lua stores that
        after the answer is known, its reply read with this index's next read (``settle``).
        """
        if not block_keys:
            return []
        self.settle()
        fields = [k.to_bytes(8, "big", signed=True) for k in block_keys]
        with_table = servable is not None and mode != ReadMode.RAW
        tail = self._feed_command(layout, feed) if feed is not None else b""
        count = self._bucket_counts.get(layout.tag) or 1 << layout.bucket_bits
        buckets = bucket_names(layout, block_keys, count)
        found: list[bytes | None] = [None] * len(block_keys)
        todo: Sequence[int] = range(len(block_keys))
        blocked: frozenset[int] = frozenset()
        while True:
            names, asked = [buckets[i] for i in todo], [fields[i] for i in todo]
            commands = read_command(layout, names, asked, with_table, tail)
            # MULTI's OK, a QUEUED per command, EXEC's reply, the hit feed's append
            exec_at = 2 + with_table + len(names)
            reply = self._exchange(layout, commands, exec_at, exec_at + 1 + bool(tail))
            if with_table:
                blocked = blocked_storages(reply[1], servable or ())
            for i, rec in zip(todo, reply[1 + with_table :], strict=True):
                found[i] = rec
            now_count = bucket_count_of(reply[0])
            if now_count == count:
                break
            # Buckets split since ``count``: what this read found stands for the keys whose
            # bucket the splits left as named; the others are read again (a second round trip,
            # only while the instance grows: docs/index-read-path.md).
            self._bucket_counts[layout.tag] = count = now_count
            now_buckets = bucket_names(layout, block_keys, count)
            todo = [i for i, (was, now) in enumerate(zip(buckets, now_buckets, strict=True)) if was != now]
            buckets = now_buckets
            if not todo:
                break
            with_table, tail = False, b""  # the table and the hit feed came with the first
        now = int(self.clock.now())
        recency = Recency(self.TOUCH_INTERVAL_S, self.LFU_DECAY_S)
        out = answer(found, mode, sw_size, blocked, covered, now, recency, self._rng)
        if out.due:
            keys = [layout.key("m"), *(buckets[i] for i in out.due)]
            args: list[bytes | int] = [
                b"".join(fields[i] for i in out.due),
                count,
                now,
                recency.interval_s,
                bytes(out.lfu),
            ]
            self._refresh_later(layout, keys, args)
        return out.records

    def _exchange(self, layout: InstanceLayout, commands: bytes, exec_at: int, count: int) -> list[Any]:
        """A read's ``count`` commands in one round trip (``valkey.exchange``): EXEC's reply,
        the ``exec_at``-th. A command refused before it (its error in place of QUEUED: EXEC
        then aborts) is raised; one refused for a slot moved to another node (MOVED) is
        read again once, on that node. The replies after EXEC (the hit feed's) are not looked at."""
        with valkey_errors("index"):
            for attempt in (1, 2):
                answered = replies(exchange(self.client, layout.tag, commands, count), count)
                failed = next((r for r in answered[: exec_at + 1] if isinstance(r, Exception)), None)
                if failed is None:
                    return cast(list[Any], answered[exec_at])
                if attempt == 2 or not follow_moved(self.client, failed):
                    raise failed
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _refresh_later(self, layout: InstanceLayout, keys: list[bytes], args: list[bytes | int]) -> None:
        """Send lua/touch.lua for a read's due records without waiting for its reply
        (``settle`` reads it). Loaded ahead of its first use on this index (and again after
        a NOSCRIPT): its reply comes too late to resend it before other calls."""
        load = b"" if self._touch_loaded else command(b"SCRIPT", b"LOAD", cast(str, self._touch.script))
        evalsha = command(b"EVALSHA", self._touch.sha, len(keys), *keys, *args)
        try:
            sent = Deferred(self.client, layout.tag, load + evalsha, replies=2 if load else 1)
        except redis.RedisError:
            return  # the refresh is lost with its connection; the read stands
        self._parked.append((sent, keys, args))
        self._touch_loaded = True

    def settle(self) -> None:
        """Wait for the recency refreshes earlier reads sent (lua/touch.lua's replies): after
        it, every read this index answered is refreshed in Valkey. A refresh whose script
        Valkey did not have (NOSCRIPT) is sent again with it; one lost with its connection
        stays lost (the block's next read refreshes it). Raises ValkeyUnavailableError
        when Valkey does not answer within the socket timeout."""
        while self._parked:
            try:
                sent, keys, args = self._parked.pop()
            except IndexError:  # another thread took the last one
                return
            try:
                sent.collect()
            except NoScriptError:  # Valkey lost its scripts (a restart, a failover)
                self._touch_loaded = False
                self._call(self._touch, keys, args)
            except redis.TimeoutError:
                with valkey_errors("index"):  # Valkey hangs: the caller's call would wait as long
                    raise
            except redis.RedisError:
                pass  # lost with its connection (or moved): the block's next read refreshes it

    @staticmethod
    def _feed_command(layout: InstanceLayout, entry: FeedEntry) -> bytes:
        """The hit-feed append (``_queue_feed``) as one command's bytes."""
        bound: tuple[bytes | str | int, ...] = (b"MAXLEN", b"~", entry.max_len) if entry.max_len else ()
        pairs = [part for item in entry.fields().items() for part in item]
        return command(b"XADD", layout.key(STREAM_SUFFIX), *bound, b"*", *pairs)

    # ---------------------------------------------------------------- writes

    def start(
        self,
        layout: InstanceLayout,
        block_keys: Sequence[int],
        req: StartRequest,
        feed: Callable[[StartOutcome], FeedEntry | None] | None = None,
    ) -> StartOutcome:
        """Add WRITING locations for the keys that have none; all or nothing. Raises
        QuotaExceededError (with the shortfall) when a quota would be passed. ``feed``
        gives the grant's hit-feed entry, appended with the group's counters update."""
        outcome = self.grant(layout, block_keys, req)
        entry = feed(outcome) if feed is not None else None
        pipe = self.client.pipeline(transaction=False)
        self.charge_group(layout, outcome.charge(req.storage_type), pipe=pipe)
        if any(outcome.new_flags):  # a session was opened
            self.queue_session_deadline(pipe, layout.instance_id, req.deadline_ms)
        if entry is not None:
            self._queue_feed(pipe, layout, entry)
        if len(pipe):
            with valkey_errors("index"):
                pipe.execute()
        return outcome

    def grant(self, layout: InstanceLayout, block_keys: Sequence[int], req: StartRequest) -> StartOutcome:
        """The start script of one shard alone: the caller moves the group's counters by
        ``outcome.charge``."""
        keys = START_KEYS.values(
            {
                "meta": layout.key("m"),
                "usage": layout.key("u"),
                "storages": layout.key("st"),
                "groups": layout.key("g"),
                "deadlines": layout.key("sd"),
                "session": layout.session(req.session_id),
                "occupied": layout.occupied,
                "pending": layout.key("pd"),
                "caller_sessions": layout.key("sc"),
            }
        )
        group = req.group_usage
        args = START_ARGS.values(
            {
                "keys": pack_keys(block_keys),
                "now_ms": int(self.clock.now() * 1000),
                "session_id": req.session_id,
                "deadline_ms": req.deadline_ms,
                "storage_name": req.storage_name,
                "storage_type": req.storage_type,
                "pack_count": req.pack_count,
                "sizes": pack_u48(req.sizes),
                "spec_groups": bytes(req.spec_groups),
                "explicit_groups": pack_u48(req.explicit_groups) if req.explicit_groups else b"",
                "group_capacity": req.group_capacity,
                "group_bytes": -1 if group is None else group.bytes,
                "type_capacity": req.type_capacity,
                "group_type_bytes": -1 if group is None else group.by_type.get(req.storage_type, 0),
                "max_keys": req.max_keys,
                "bucket_prefix": layout.bucket_prefix,
                "records_per_bucket": self.RECORDS_PER_BUCKET,
                "instance_id": layout.instance_id,
                "incarnation": layout.incarnation,
                "max_sessions": req.max_sessions,
                "instance_capacity": req.instance_capacity,
                "min_replicas": max(1, req.min_replicas),
                "stale": b"".join(SESSION_ENTRY.pack(k.to_bytes(8, "big", signed=True), loc) for k, loc in req.stale),
                "covers": req.covers,
                "spec_group_count": max(1, math.isqrt(len(req.covers))),
                "by_location": "1" if req.by_location else "0",
                "candidate_count": len(req.more_candidates),
            }
        )
        for c in req.more_candidates:
            args += START_CANDIDATE_ARGS.values(
                {
                    "name": c.name,
                    "storage_type": c.storage_type,
                    "pack_count": c.pack_count,
                    "type_capacity": c.type_capacity,
                    "group_type_bytes": c.group_type_bytes,
                    "by_location": int(c.by_location),
                }
            )
        pending = self.pending_deadline() if req.stale else 0
        args += START_TAIL_ARGS.values(
            {
                "partial": int(req.partial),
                # Stale locations turn DELETING: they pend from now.
                "pending_deadline": pending,
                "caller_cap": req.max_caller_sessions if req.caller else 0,
                "caller": req.caller,
                "positions": b"".join(REQUEST_POSITION.pack(p) for p in req.positions),
            }
        )
        reply = self._call_queued(self._start, keys, args, before=self._due_at(layout, pending))
        if reply[START_GRANT.at("result")] == StartResult.REFUSED:
            raise self._refusal(layout, req, reply)
        written_to = tuple(c - ord("0") for c in reply[START_GRANT.at("written_to")])
        storage_indexes = tuple(int(x) for x in reply[START_GRANT.at("storage_indexes")].split(b","))
        charge = [int(x) if x.isdigit() else x for x in reply[START_GRANT.at("charge")].split(b",")]
        by_type = START_GRANT.at("by_type")
        return StartOutcome(
            int(reply[START_GRANT.at("first_location_id")]),
            [c > 0 for c in written_to],
            storage_indexes[0],
            int(reply[START_GRANT.at("new_bytes")]),
            written_to=written_to,
            storage_indexes=storage_indexes,
            created=int(reply[START_GRANT.at("created")]),
            bytes_by_type={reply[i].decode(): int(reply[i + 1]) for i in range(by_type, len(reply), 2)},
            victims=tuple(decode_victims(reply[START_GRANT.at("victims")])),
            pruned=Usage.from_charge(charge),
            marks=_start_marks(reply[START_GRANT.at("marks")]),
        )

    @staticmethod
    def _refusal(layout: InstanceLayout, req: StartRequest, reply: Sequence[Any]) -> Exception:
        """The error of a refused start's reply."""
        reason = StartRefusal(reply[START_REFUSAL.at("reason")].decode())
        if reason == StartRefusal.GONE:
            return InstanceGoneError(f"instance '{layout.instance_id}' is being removed or was registered again")
        shortfall = START_REFUSAL.at("shortfall")
        return QuotaExceededError(
            reason,
            {
                StartRefusal.INSTANCE: "the instance's quota (instance_quotas) reached",
                StartRefusal.GROUP: "instance group quota reached",
                StartRefusal.TYPE: f"quota of storage type {req.storage_type} reached",
                StartRefusal.KEYS: "max_key_count of the instance reached",
                StartRefusal.STORAGES: f"the instance has written to 255 storages, the most it can address; "
                f"{req.storage_name} is not one of them",
                StartRefusal.SESSIONS: f"the instance has {req.max_sessions} write sessions open, the most "
                f"allowed (KVCM_MAX_WRITE_SESSIONS): finish them, or wait for them to expire",
                StartRefusal.CALLER_SESSIONS: f"account {req.caller!r} has {req.max_caller_sessions} write "
                f"sessions open on the instance, the most one caller may (KVCM_MAX_WRITE_SESSIONS_PER_CALLER): "
                f"finish them, or wait for them to expire",
            }[reason],
            int(reply[shortfall]) if len(reply) > shortfall else 0,
            req.storage_type,
        )

    def session(self, layout: InstanceLayout, session_id: str) -> Session | None:
        """A write session's deadline and (key, location id) entries, or None."""
        with valkey_errors("index"):
            deadline, raw = cast(list[bytes | None], self.client.hmget(layout.session(session_id), "d", "k"))
        if deadline is None or raw is None:
            return None
        return Session(int(deadline), session_entries(raw), raw)

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
        """Close ``session`` (as read by ``session``): successful blocks SERVING, the rest
        DELETING (returned). Raises WriteSessionError when the
        session is gone (finished, expired and reaped, never existed, or another
        instance's). ``sizes``: block bytes per spec group. ``mark_clear``: the tiered
        Marks a location turning SERVING on their target clears (None: none).
        ``release_guard``: the guard state of the quarantined Copy this releases (with
        ``force_fail``); a quarantined session is closed only so (CopyGuardError otherwise,
        and when its guard state is another)."""
        if len(success) != len(session.entries) and not force_fail:
            raise WriteSessionError(
                f"field 'success_blocks': the session has {len(session.entries)} blocks, the mask {len(success)}"
            )
        flags = bytes(ord("1") if s else ord("0") for s in success)
        now_ms = int(self.clock.now() * 1000)
        # Blocks fail (turn DELETING) when forced, reported failed, or the session expired.
        failing = force_fail or not all(success) or now_ms > session.deadline_ms
        pending = self.pending_deadline() if failing else 0
        reply = self._call_queued(
            self._finish,
            [
                layout.key("sd"),
                layout.session(session_id),
                layout.key("u"),
                layout.key("st"),
                layout.key("pd"),
                layout.key("sc"),
            ],
            [
                now_ms,
                session_id,
                flags,
                "1" if force_fail else "0",
                session.raw,
                layout.bucket_prefix,
                pack_u48(sizes),
                layout.instance_id,
                pending,
                mark_clear.policy.value if mark_clear is not None else "",
                mark_clear.covers if mark_clear is not None else b"",
                max(1, math.isqrt(len(mark_clear.covers))) if mark_clear is not None else 1,
                str(int(release_guard)) if release_guard is not None else "",
            ],
            before=self._due_at(layout, pending),
        )
        status = FinishStatus(reply[0])
        if status == FinishStatus.GUARDED:
            raise CopyGuardError(f"copy operation {session_id!r} is not in the guard state named")
        if status in (FinishStatus.UNKNOWN, FinishStatus.CHANGED):
            raise WriteSessionError(f"write session {session_id!r} is unknown, finished or expired")
        self.charge_group(layout, Usage.from_charge(reply[4:]))
        uncommitted = [j for j, flag in enumerate(reply[2]) if flag == ord("1")]
        expired = status == FinishStatus.EXPIRED
        lapsed = list(range(len(session.entries))) if expired else []
        consumed, active = (int(x) for x in reply[3].split(b","))
        marks = MarkCounts(consumed=consumed, active=active if consumed else None)
        return FinishOutcome(expired, decode_victims(reply[1]), uncommitted, lapsed, marks)

    # The reaper's due set: per instance with open sessions, a deadline no later than its
    # earliest session's. It lives on a slot of its own, so a start adds to it right after
    # its script (in the group counters' round trip); a start dying in between leaves its
    # session out until the reaper's full sweep (workflows.reaper.FULL_SWEEP_S).

    @property
    def _session_due_key(self) -> str:
        return f"{{{self.prefix}:reaper}}:due"

    def queue_session_deadline(self, pipe: Any, instance_id: str, deadline_ms: int) -> None:
        """Queue on ``pipe``: the instance has a session due at ``deadline_ms`` (the due
        set keeps the earliest)."""
        pipe.zadd(self._session_due_key, {instance_id: deadline_ms}, lt=True)

    def instances_due(self, now_ms: int, limit: int = 1000) -> list[str]:
        """The instances that may have a session past its deadline at ``now_ms``."""
        with valkey_errors("index"):
            due = cast(list[bytes], self.client.zrangebyscore(self._session_due_key, "-inf", now_ms, 0, limit))
        return [instance_id.decode() for instance_id in due]

    # ---------------------------------------------------------------- pending deletions

    @property
    def _due_key(self) -> str:
        return f"{{{self.prefix}:deletions}}:due"

    def pending_deadline(self, delay_ms: int = 0) -> int:
        """The pending deadline (s) of locations turning DELETING now, handed to deletion
        ``delay_ms`` after: their hand-off counts as lost after it."""
        return int(self.clock.now()) - (-delay_ms // 1000) + self.DELETION_LOST_AFTER_S

    def queue_due(self, pipe: Any, layout: InstanceLayout, deadline: int) -> None:
        """Queue on ``pipe``: the instance has deletions pending until ``deadline`` (s)
        (registered due at the first step at or after it)."""
        due = -(-deadline // self.DUE_STEP_S) * self.DUE_STEP_S
        pipe.zadd(self._due_key, {f"{due}:{layout.instance_id}": due})

    def _due_at(self, layout: InstanceLayout, deadline: int) -> Callable[[Any], None] | None:
        """What a script turning locations DELETING (pending until ``deadline``; 0: none)
        queues ahead of itself, in its own round trip (``_call_queued``). The due set is on
        a slot of its own, so no script can write it: the registration must be in place
        whenever the script ran, or a process dying between the mark and the hand-off
        would leave the locations unfound. Queued first, it is: on one node both go over
        one connection, which runs them in order; a cluster pipeline writes to the nodes
        in the order of their first command, so the registration is sent (handed to the
        socket) before the script is, and a moved or failed registration is sent again
        before the call returns (``_call_queued``). Should that fail too, the marked
        locations stay pending in the instance's set, found by its next registration. A
        registration whose script never ran finds nothing and goes (capacity/stranded.py)."""
        return partial(self.queue_due, layout=layout, deadline=deadline) if deadline else None

    def due_deletions(self, now_s: int, limit: int) -> dict[str, list[bytes]]:
        """Instances with deletions due by ``now_s``, each with its due members (at most
        ``limit`` members in all, oldest first)."""
        with valkey_errors("index"):
            members = cast(list[bytes], self.client.zrangebyscore(self._due_key, "-inf", now_s, start=0, num=limit))
        out: dict[str, list[bytes]] = {}
        for member in members:
            out.setdefault(member.split(b":", 1)[1].decode(), []).append(member)
        return out

    def settle_due(self, members: Sequence[bytes]) -> None:
        """Drop due members whose instance's overdue deletions were all handed over again:
        any location pending for later has a member of its own, due later."""
        if members:
            with valkey_errors("index"):
                self.client.zrem(self._due_key, *members)

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
        """Locations of ``block_keys`` → DELETING (they stop serving now); returns them.

        ``sizes`` are the block bytes per spec group, charged to the deleting counters.
        Every location returned is pending until its deletion drops it: lost if not
        dropped ``delay_ms`` (the delay it is handed over with) plus
        ``DELETION_LOST_AFTER_S`` after now. Unless ``serving_only``, DELETING locations
        lost by ``resubmit_before_s`` (s) are returned too, pending anew: removing a block
        again retries them; ``lost_only`` takes those alone (the recovery of lost deletions).
        ``expected_locations`` takes only those location ids; ``max_children`` skips a key
        whose record counts more children than its entry (one gained a child meanwhile).
        """
        if not block_keys:
            return []
        expected = b"".join(v.to_bytes(5, "big") for v in expected_locations) if expected_locations else b""
        limits = struct.pack(f">{len(max_children)}H", *max_children) if max_children else b""
        scope = MarkScope.SERVING if serving_only else MarkScope.LOST if lost_only else MarkScope.ANY
        pending = self.pending_deadline(delay_ms)
        reply = self._call_queued(
            self._mark,
            [layout.key("u"), layout.key("st"), layout.key("pd")],
            [
                pack_keys(block_keys),
                expected,
                scope.value,
                layout.bucket_prefix,
                limits,
                int(self.clock.now()),
                resubmit_before_s,
                pack_u48(sizes),
                pending,
            ],
            before=self._due_at(layout, pending),
        )
        self.charge_group(layout, Usage.from_charge(reply[1:]))
        return decode_victims(reply[0])

    def restore(self, layout: InstanceLayout, victims: Sequence[Victim], sizes: Sequence[int]) -> int:
        """Undo ``mark_deleting`` for ``victims`` never handed to deletion (a write path
        eviction whose start was refused): each location still DELETING under its id
        serves again, its deleting charge released; returns how many."""
        if not victims:
            return 0
        reply = self._call(
            self._restore,
            [layout.key("u"), layout.key("st"), layout.key("pd")],
            [encode_victims(list(victims)), layout.bucket_prefix, pack_u48(sizes)],
        )
        self.charge_group(layout, Usage.from_charge(reply[1:]), -1)
        return int(reply[0])

    def drop(self, layout: InstanceLayout, victims: Sequence[Victim], sizes: Sequence[int]) -> DropOutcome:
        """Compare-and-delete DELETING locations: their bytes are released."""
        if not victims:
            return DropOutcome(0, [], Usage())
        keys = [layout.key("u"), layout.key("st"), layout.key("g"), layout.key("og"), layout.occupied, layout.key("pd")]
        reply = self._call(
            self._drop,
            keys,
            [encode_victims(list(victims)), pack_u48(sizes), layout.bucket_prefix],
        )
        blob = reply[1]
        by_type = {reply[i].decode(): int(reply[i + 1]) for i in range(4, len(reply) - 1, 2)}
        freed = Usage(int(reply[2]), int(reply[3]), by_type, {}, int(reply[2]), int(reply[3]), dict(by_type))
        self.charge_group(layout, freed, -1)
        return DropOutcome(int(reply[0]), packed_groups(blob), freed)

    def forget(self, layout: InstanceLayout, block_keys: Sequence[int], location_ids: Sequence[int]) -> int:
        """Drop the records of ``block_keys`` (still holding ``location_ids``, not DELETING)
        without deleting their data, which stays charged (lua/forget.lua); returns how many."""
        if not block_keys:
            return 0
        forgotten = int(
            self._call(
                self._forget,
                [layout.key("u"), layout.occupied, layout.key("fg")],
                [
                    pack_keys(block_keys),
                    b"".join(v.to_bytes(5, "big") for v in location_ids),
                    layout.bucket_prefix,
                ],
            )
        )
        self.charge_group(layout, Usage(keys=forgotten), -1)
        return forgotten

    def release_forgotten(self, layout: InstanceLayout, victims: Sequence[Victim], sizes: Sequence[int]) -> int:
        """Release forgotten locations whose data is deleted: their bytes leave the usage
        counters, the group's too (lua/release.lua); returns how many were still held."""
        if not victims:
            return 0
        reply = self._call(
            self._release,
            [layout.key("u"), layout.key("st"), layout.key("g"), layout.key("fg")],
            [encode_victims(list(victims)), pack_u48(sizes)],
        )
        by_type = {reply[i].decode(): int(reply[i + 1]) for i in range(2, len(reply) - 1, 2)}
        self.charge_group(layout, Usage(int(reply[1]), 0, by_type), -1)
        return int(reply[0])

    def assign_storage(self, layout: InstanceLayout, name: str, storage_type: str) -> tuple[int, int]:
        """Give storage ``name`` an index in the key space unless it has one (lua/storage.lua):
        (storages assigned, its index; 0 once all 255 are taken)."""
        assigned, index = self._call(self._storage, [layout.key("m"), layout.key("st")], [name, storage_type])
        return int(assigned), int(index)

    def claim_key_space(
        self,
        layout: InstanceLayout,
        registering: bool,
        wanted_shards: str = "",
        others_hold: bool = False,
        first_location_id: int = 0,
    ) -> tuple[int, ClaimOutcome, bytes | None]:
        """Bind the key space to ``layout.incarnation`` (lua/claim.lua, asking for
        ``layout.bucket_bits``): (its bucket bits, the outcome, its shard suffixes as stored)."""
        bits, outcome, stored = self._call(
            self._claim,
            [layout.key("m"), layout.occupied],
            [
                layout.bucket_bits,
                layout.incarnation,
                "1" if registering else "0",
                wanted_shards,
                "1" if others_hold else "0",
                first_location_id,
            ],
        )
        return int(bits), ClaimOutcome(outcome.decode()), stored

    def storage_names(self, layout: InstanceLayout) -> dict[int, str]:
        """Storage index → storage name, as assigned by starts (append-only)."""
        with valkey_errors("index"):
            raw = cast(RawHash, self.client.hgetall(layout.key("st")))
        return {int(k[1:]): v.decode() for k, v in raw.items() if k.startswith(b"#")}

    def occupied_page(self, layout: InstanceLayout, cursor: int, count: int) -> tuple[int, list[int]]:
        """One SSCAN page of the occupied buckets: (next cursor, 0 at the end; buckets)."""
        with valkey_errors("index"):
            cursor, members = self.client.sscan(layout.occupied, cursor, count=count)
        return int(cursor), [int(m) for m in members]

    def occupied_sample(self, layout: InstanceLayout, count: int) -> tuple[int, list[int]]:
        """How many buckets are occupied, and up to ``count`` distinct ones at random (all
        of them when fewer), in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        pipe.scard(layout.occupied)
        pipe.srandmember(layout.occupied, count)
        with valkey_errors("index"):
            total, members = pipe.execute()
        return int(total), [int(m) for m in members]

    def drop_all(self, layout: InstanceLayout, keep_usage: bool = False) -> None:
        """Delete an instance's blocks and sessions (metadata only), and its usage unless
        ``keep_usage`` (the data stays on storage, charged). The small meta hash and the
        storage table stay: bucket bits, location ids and storage indexes must never
        restart, or a late deletion of an old location could match a new one.

        Costs the occupied buckets; the group's counters lose what the instance's had
        (its deleting part too, with ``keep_usage``: nothing of it will be dropped)."""
        with valkey_errors("index"):
            usage = Usage.from_hash(cast(RawHash, self.client.hgetall(layout.key("u"))))
            session_ids = cast(list[bytes], self.client.zrange(layout.key("sd"), 0, -1))
            sessions = [layout.session(sid.decode()) for sid in session_ids]
        cursor = 0
        while True:
            cursor, buckets = self.occupied_page(layout, cursor, 1000)
            with valkey_errors("index"):
                if buckets:
                    self.client.unlink(*[layout.bucket(b) for b in buckets])
            if cursor == 0:
                break
        fixed = [layout.key(s) for s in ("g", "og", "sd", "sc", "dq", "fg", "pd")] + [layout.occupied]
        if keep_usage:
            # No record is left: nothing counts as DELETING or as a key any more, nor as
            # demoting (the sessions are gone: no finish will give it back).
            with valkey_errors("index"):
                self.client.hset(
                    layout.key("u"),
                    mapping={
                        "keys": 0,
                        "d": 0,
                        "dk": 0,
                        **{f"dt:{t}": 0 for t in usage.deleting_by_type},
                        **{f"mt:{t}": 0 for t in usage.demoting_by_type},
                    },
                )
            self.charge_group(
                layout,
                Usage(0, usage.keys, {}, {}, usage.deleting_bytes, usage.deleting_keys, dict(usage.deleting_by_type)),
                -1,
            )
        else:
            fixed.append(layout.key("u"))
            self.charge_group(layout, usage, -1)
        with valkey_errors("index"):
            for start in range(0, len(sessions), 1000):
                self.client.unlink(*sessions[start : start + 1000])
            self.client.unlink(*fixed)

    # ---------------------------------------------------------------- reclaim support
    # Added for chalicelib.capacity (the reclaimer): bounded reads of a few buckets, the
    # storage table with types, a per-instance sweep cursor, and the wake set.

    def storage_table(self, layout: InstanceLayout) -> dict[int, tuple[str, str]]:
        """Storage index → (storage name, storage type name), as assigned by starts: the
        type usage counters were charged to (lua/start.lua, lua/drop.lua)."""
        with valkey_errors("index"):
            raw = cast(RawHash, self.client.hgetall(layout.key("st")))
        return {
            int(k[1:]): (v.decode(), raw.get(b"t" + k[1:], b"").decode()) for k, v in raw.items() if k.startswith(b"#")
        }

    # ---------------------------------------------------------------- deletion queue
    # Victims marked on the write path wait here for the reclaimer to hand them to the
    # deleter, so a write never waits for a Step Functions call.

    @property
    def _deletion_queue_set(self) -> str:
        return f"{{{self.prefix}:deleteq}}:instances"

    def queue_deletions(self, layout: InstanceLayout, victims: Sequence[Victim]) -> None:
        """Append victims (already DELETING) to the instance's deletion queue."""
        if not victims:
            return
        pipe = self.client.pipeline(transaction=False)
        pipe.rpush(layout.key("dq"), encode_victims(list(victims)))
        pipe.sadd(self._deletion_queue_set, layout.instance_id)
        with valkey_errors("index"):
            pipe.execute()

    def take_queued_deletions(
        self, layout_of: Callable[[str], InstanceLayout | None], max_entries: int = 256
    ) -> dict[str, list[Victim]]:
        """Pop the queued victims of every instance that has some (``layout_of`` maps an
        instance id to its layout, None when it is gone: its queue is dropped). An
        instance leaves the set before its queue is read, so a push racing the read puts
        it back."""
        with valkey_errors("index"):
            instance_ids = [m.decode() for m in cast(set[bytes], self.client.smembers(self._deletion_queue_set))]
        out: dict[str, list[Victim]] = {}
        for instance_id in instance_ids:
            with valkey_errors("index"):
                self.client.srem(self._deletion_queue_set, instance_id)
            layout = layout_of(instance_id)
            key = (layout or InstanceLayout(self.prefix, instance_id, 0)).key("dq")
            with valkey_errors("index"):
                entries = cast(list[bytes] | None, self.client.lpop(key, max_entries)) or []
                if len(entries) == max_entries:
                    self.client.sadd(self._deletion_queue_set, instance_id)  # more next time
            if layout is not None and entries:
                out[instance_id] = [v for entry in entries for v in decode_victims(entry)]
        return out

    @property
    def _reclaim_wake_key(self) -> str:
        return f"{{{self.prefix}:reclaim}}:wake"

    def request_reclaim(self, group: str) -> None:
        """Ask the reclaimer to look at ``group`` in its next round."""
        with valkey_errors("index"):
            self.client.sadd(self._reclaim_wake_key, group)

    def take_reclaim_requests(self) -> set[str]:
        """The groups asked for since the last call, read and cleared atomically."""
        pipe = self.client.pipeline(transaction=True)
        pipe.smembers(self._reclaim_wake_key)
        pipe.delete(self._reclaim_wake_key)
        with valkey_errors("index"):
            members, _ = pipe.execute()
        return {m.decode() for m in members}
