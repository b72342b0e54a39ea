"""The meta data plane: cache hits, two-phase writes, removal and trimming.

Every call touches Valkey only (plus the per-container config): a read is one round
trip; a start one, plus one to move the group's usage counters when it wrote something,
plus one to read them when the group has a quota and this container's copy is older than
``GROUP_USAGE_MAX_AGE_S``; a finish two. A start refused for a quota makes room in its
instance (``make_room``, the capacity layer's write path eviction) and is tried again as
``room_policy`` says (cache.room): at last as a partial grant, the longest leading run of
its keys that fits. A start writing no key opens no session (its id is one that a finish
accepts with nothing to close: ``is_empty_session_id``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..clock import Clock, now_us
from ..index import BlockIndex, Status, Usage
from ..index.errors import QuotaExceededError, WriteSessionError
from ..index.layout import StartRefusal
from ..index.records import decode_record
from ..index.types import (
    MODE_BATCH,
    MODE_PREFIX,
    MODE_RAW,
    MODE_WINDOW,
    Candidate,
    StartOutcome,
    StartRequest,
    rightmost_window,
)
from ..observability.hit_feed import KEYWISE, PREFIX, FeedEntry, HitFeed, off
from ..observability.logging import logger
from ..observability.metrics import MetricsRegistry
from ..protocol.block_keys import request_keys
from ..protocol.codes import CacheLocationStatus, QueryType, StorageType, TrimStrategy
from ..protocol.errors import CapacityExceededError, InvalidArgumentError, StorageIOError
from ..protocol.models import (
    BlockMask,
    BoolMasks,
    CacheLocations,
    FinishWriteCacheRequest,
    FinishWriteCacheResponse,
    GetCacheLocationRequest,
    GetCacheLocationResponse,
    GetCacheMetaDetailRequest,
    GetCacheMetaDetailResponse,
    GetCacheMetaRequest,
    GetCacheMetaResponse,
    InstanceGroup,
    RemoveCacheRequest,
    Response,
    ResponseHeader,
    StartWriteCacheRequest,
    StartWriteCacheResponse,
    TrimCacheRequest,
)
from ..protocol.models import Status as WireStatus
from ..protocol.wire import render
from ..settings import Settings
from ..storage.base import BlockRef, StorageBackend
from .context import InstanceContext, StorageState
from .deletion import Deleter
from .event_reports import Reported, pick_reported, reported_location_json
from .locations import ANY_STATUS, LocationRenderer
from .marks import mark_clearing, record_marks, spec_group_coverage
from .masks import mask_of, masked_flags
from .purge import CACHE, META, PurgeService
from .replicas import WIRE_STATUS, Copy, detail_item, key_replicas, reported_copies, stored_copies
from .room import MadeRoom, NoRoom, RetryWithEviction

_SESSION_ALPHABET = b"abcdefghijklmnopqrstuvwxyz0123456789"
#: How stale this container's copy of a group's usage may be when a start checks the
#: group quota: the other instances' part is read from it (lua/start.lua).
GROUP_USAGE_MAX_AGE_S = 0.1
#: What a response may carry: Lambda refuses a response over 6 MB (6,291,456 bytes)
#: after the work is done, so a start whose locations could not fit is refused before it
#: grants anything (headers and the envelope take the rest).
MAX_RESPONSE_BYTES = 6_000_000
_MATCH_METRICS = {
    QueryType.QT_PREFIX_MATCH: "manager.prefix_match_len",
    QueryType.QT_BATCH_GET: "manager.batch_get_len",
    QueryType.QT_REVERSE_ROLL_SW_MATCH: "manager.sw_match_len",
}
#: The blocks a read asked for (unmasked ones for a prefix match): hit ratio = found / asked.
_ASKED_METRICS = {
    QueryType.QT_PREFIX_MATCH: "manager.prefix_match_asked",
    QueryType.QT_BATCH_GET: "manager.batch_get_asked",
    QueryType.QT_REVERSE_ROLL_SW_MATCH: "manager.sw_match_asked",
}


class KeysRequest(Protocol):
    """A request naming its keys by block key or by token ids."""

    @property
    def block_keys(self) -> Sequence[int]: ...

    @property
    def token_ids(self) -> Sequence[int]: ...


@dataclass(frozen=True)
class StartPlan:
    """One start's request, checked, and what each candidate's try shares."""

    ctx: InstanceContext
    keys: list[int]
    spec_groups: list[int]
    #: The group's available candidate storages, in the order they are tried.
    candidates: list[StorageState]
    renderer: LocationRenderer
    session_id: str
    deadline_ms: int
    min_replicas: int
    stale: list[tuple[int, int]]
    covers: bytes
    #: The account starting (auth on; "": none), whose own open sessions are capped.
    caller: str

    def further(self, position: int) -> list[StorageState]:
        """The candidates after ``position`` one start script call may also write to
        (not those placing blocks themselves: only the first gets explicit ids)."""
        return [c for c in self.candidates[position + 1 :] if not _allocates(c.backend)]


class NoAvailableStorageError(StorageIOError):
    """Every storage of the group is unavailable."""


def new_session_id(writes: bool = True) -> str:
    """A random 32-character ``[a-z0-9]`` write session id; it starts with ``0`` exactly
    when the start wrote no key (``writes`` False: no session was stored)."""
    body = bytes(_SESSION_ALPHABET[b % 36] for b in os.urandom(31)).decode()
    first = "0" if not writes else chr(_SESSION_ALPHABET[1 + os.urandom(1)[0] % 35])
    return first + body


def is_empty_session_id(session_id: str) -> bool:
    """Whether ``session_id`` is one a start that wrote no key answered."""
    return len(session_id) == 32 and session_id[0] == "0"


def _allocates(backend: StorageBackend) -> bool:
    """Whether the backend places blocks itself (explicit group ids reserved per start:
    only the start's first candidate gets them)."""
    return type(backend).reserve is not StorageBackend.reserve


def addresses_by_location(backend: StorageBackend) -> bool:
    """Whether a key's locations on the backend have distinct data places (packed files,
    allocated ranges), so that one key may have several there; backends naming objects by
    key alone (S3, Mooncake) may hold one."""
    return backend.pack_count > 0 or _allocates(backend)


#: A location's arguments at their widest: the rendered text is the longest that storage
#: and spec group give (block key 2^63 - 1, location id 40 bits, group id 48, slot 16).
_WIDEST_ARGS = ((1 << 63) - 1, (1 << 40) - 1, (1 << 48) - 1, 0xFFFF)
#: A getCacheMeta meta at its widest, as it sits in the answer's JSON (a JSON string of
#: JSON, its comma included).
_WIDEST_META = (
    max(
        len(json.dumps(json.dumps({"id": str(_WIDEST_ARGS[1]), "status": status.name})))
        for status in CacheLocationStatus
    )
    + 1
)
#: A replica_locations entry beyond its one location's JSON at its widest: the envelope, the
#: widest id, status and create time (µs, 16 digits), and per spec an empty node id.
_REPLICA_ENVELOPE = len(
    f'{{"locations":[{{"id":"{_WIDEST_ARGS[1]}","status":"CLS_DELETING","create_time":"{10**16 - 1}",}}]}},'
)
_REPLICA_PER_SPEC = len(',"node_id":""')
#: A getCacheMetaDetail item beyond its one location's JSON at its widest: the item's fields
#: with the widest values, the header's properties and the location's extra fields.
_DETAIL_ENVELOPE = len(
    json.dumps(
        {
            "request_index": (1 << 31) - 1,
            "block_key": str(-(1 << 63)),
            "prev_block_key": str(-(1 << 63)),
            "properties": {
                "last_access_s": str((1 << 32) - 1),
                "lfu": "255",
                "write_time_ms": str((1 << 48) - 1),
                "children": "65535",
                "BP#prev_key": str(-(1 << 63)),
            },
            "locations": [
                {"location_id": str(_WIDEST_ARGS[1]), "status": "CLS_DELETING", "create_time": str(10**16 - 1)}
            ],
            "status": {"code": "OK", "message": ""},
        }
    )
)


def location_widths(
    renderer: LocationRenderer, states: Sequence[StorageState], spec_groups: Iterable[int]
) -> dict[int, int]:
    """Per spec group, the bytes of its longest location on any of ``states`` (with the
    comma that separates it in the answer): the instance's specs, filtered as the renderer
    is, and their URIs as each storage's layout makes them."""
    widths: dict[int, int] = {}
    for spec_group in spec_groups:
        for state in states:
            template, args = renderer.prepared(state, spec_group)
            widths[spec_group] = max(widths.get(spec_group, 0), len(template % args(*_WIDEST_ARGS)) + 1)
    return widths


def _require_a_servable_storage(ctx: InstanceContext) -> None:
    """A read of a group whose every storage is unavailable fails (NoAvailableStorageError)."""
    if ctx.storages and not any(s.available for s in ctx.storages):
        raise NoAvailableStorageError(f"every storage of instance group {ctx.group.name!r} is unavailable")


def refuse_oversized_answer(ctx: InstanceContext, req: KeysRequest, total: int, per_key: int) -> None:
    """Refuse a request whose answer could pass ``MAX_RESPONSE_BYTES`` (``total`` bytes at
    most, ``per_key`` for its widest key) with the largest key count that fits, in the
    unit of the field the request named its keys by."""
    if total <= MAX_RESPONSE_BYTES:
        return
    fit = MAX_RESPONSE_BYTES // max(per_key, 1)
    if req.block_keys:
        field, most = "block_keys", f"{fit} keys"
    else:
        field, most = "token_ids", f"{fit * ctx.block_size} tokens ({fit} blocks of {ctx.block_size})"
    raise InvalidArgumentError(
        f"field '{field}': the answer could need {total / 1e6:.1f} MB, over the {MAX_RESPONSE_BYTES / 1e6:.0f} MB "
        f"an API response may carry: send at most {most} per call for instance {ctx.instance_id!r}"
    )


class CacheService:
    """MetaService's cache methods over one instance context at a time."""

    def __init__(
        self,
        index: BlockIndex,
        contexts: Callable[[str], InstanceContext],
        deleter: Deleter,
        purge: PurgeService,
        clock: Clock,
        settings: Settings,
        metrics: MetricsRegistry,
        on_capacity_refused: Callable[[str], None] = lambda group: None,
        make_room: Callable[[InstanceContext, QuotaExceededError, frozenset[int]], MadeRoom] = lambda ctx,
        refusal,
        protected: NoRoom(),
        room_policy: RetryWithEviction | None = None,
        reported: Callable[[str, InstanceGroup, list[int]], list[list[Reported]] | None] = lambda instance_id,
        group,
        keys: None,
        hit_feed: HitFeed | None = None,
    ) -> None:
        self.index = index
        #: The sampled reads and writes the live hit-ratio curves are built from.
        self.hit_feed = hit_feed or off()
        #: ``reported(instance_id, group, keys)``: per key, its visible reported locations;
        #: None when the group has no event-report storage (EventReports.visible_if_configured).
        self.reported = reported
        #: Called with the group's name when a start is refused for capacity (wakes the reclaimer).
        self.on_capacity_refused = on_capacity_refused
        #: ``make_room(ctx, refusal, protected)``, called when a start is refused for a
        #: quota: marks victims in the instance (never one of the ``protected`` keys, the
        #: write's own) and holds them until the start is answered (cache.room).
        self.make_room = make_room
        #: When a start refused for a quota makes room and tries again.
        self.room_policy = room_policy or RetryWithEviction()
        self._group_usage: dict[str, tuple[float, Usage]] = {}
        self.metrics = metrics
        self.contexts = contexts
        self.deleter = deleter
        self.purge = purge
        self.clock = clock
        self.settings = settings
        self._storage_names: dict[str, dict[int, str]] = {}
        self._read_widths: dict[str, tuple[InstanceContext, int]] = {}

    # ---------------------------------------------------------------- helpers

    def _keys(self, ctx: InstanceContext, req: KeysRequest) -> list[int]:
        return request_keys(
            req.block_keys, req.token_ids, ctx.block_key_scheme, ctx.block_size, self.settings.max_keys_per_request
        )

    def _storage_name(self, ctx: InstanceContext, sidx: int) -> str:
        names = self._storage_names.get(ctx.instance_id)
        if names is None or sidx not in names:
            names = self.index.storage_names(ctx.layout)
            self._storage_names[ctx.instance_id] = names
        return names.get(sidx, "")

    def _renderer(self, ctx: InstanceContext, spec_names: frozenset[str] | None = None) -> LocationRenderer:
        return LocationRenderer(ctx, lambda sidx: self._storage_name(ctx, sidx), spec_names)

    def _spec_filter(self, ctx: InstanceContext, names: Sequence[str]) -> frozenset[str] | None:
        if not names:
            return None
        known = {s.name for s in ctx.spec_layout.specs}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise InvalidArgumentError(f"field 'location_spec_names': unknown location spec {unknown[0]!r}")
        return frozenset(names)

    def bound_read_answer(
        self,
        ctx: InstanceContext,
        req: KeysRequest,
        key_count: int,
        renderer: LocationRenderer | None = None,
        per_key_extra: int = 0,
        filtered: bool = False,
        locations_per_key: int = 1,
    ) -> None:
        """Refuse, before any read, a read whose answer could pass ``MAX_RESPONSE_BYTES``:
        ``key_count`` times ``locations_per_key`` locations as wide as the widest the
        instance's available storages give in any spec group (rendered by ``renderer``, by
        default every spec; ``filtered``: the renderer renders some specs only), plus
        ``per_key_extra`` bytes each key. Arithmetic on the instance's cached layout: the
        unfiltered width is kept while the context is the same."""
        cached = None if filtered else self._read_widths.get(ctx.instance_id)
        if cached is not None and cached[0] is ctx:
            widest = cached[1]
        else:
            renderer = renderer or self._renderer(ctx)
            states = [s for s in ctx.storages if s.available]
            widths = location_widths(renderer, states, range(len(ctx.spec_layout.groups) + 1))
            widest = max([len(renderer.padding()) + 1, *widths.values()])
            if not filtered:
                self._read_widths[ctx.instance_id] = (ctx, widest)
        per_key = widest * locations_per_key + per_key_extra
        refuse_oversized_answer(ctx, req, key_count * per_key, per_key)

    # ---------------------------------------------------------------- reads

    def get_cache_location(self, req: GetCacheLocationRequest, bounded: bool = True) -> GetCacheLocationResponse:
        """Locations of the cached blocks among the request's keys (API.md, Read semantics).

        A key is a hit when it has a SERVING stored location or a visible reported one
        (docs/api-v2.md): the stored one is served when both exist. Without event-report
        storages in the group this is one round trip; with them, the reported locations are
        read first (one more). A request whose answer could pass ``MAX_RESPONSE_BYTES`` is
        refused first, unless not ``bounded`` (the caller answers something smaller than
        the locations)."""
        started = time.perf_counter()
        ctx = self.contexts(req.instance_id)
        if req.query_type == QueryType.QT_UNSPECIFIED:
            raise InvalidArgumentError("field 'query_type' is required")
        if req.query_type not in _MATCH_METRICS:  # QT_PREFIX_MATCH_WITH_MAMBA: getHostCacheState's only
            raise InvalidArgumentError(f"field 'query_type': {req.query_type.name} is not served by getCacheLocation")
        keys = self._keys(ctx, req)
        names = self._spec_filter(ctx, req.location_spec_names)
        if req.query_type == QueryType.QT_REVERSE_ROLL_SW_MATCH and not 1 <= req.sw_size <= len(keys):
            raise InvalidArgumentError(f"field 'sw_size': {req.sw_size} must be between 1 and the {len(keys)} keys")
        asked = keys
        if req.query_type == QueryType.QT_PREFIX_MATCH:
            flags = masked_flags(req.block_mask, len(keys), "block_mask")
            asked = [k for k, masked in zip(keys, flags, strict=True) if not masked]
        _require_a_servable_storage(ctx)
        renderer = self._renderer(ctx, names)
        if bounded:
            self.bound_read_answer(ctx, req, len(asked), renderer, filtered=names is not None)
        reported = self._reported_texts(ctx, asked, names) or []
        covered = [t is not None for t in reported] if any(t is not None for t in reported) else None
        texts: list[str] = []
        feed = self.hit_feed.read(
            ctx.instance_id, PREFIX if req.query_type == QueryType.QT_PREFIX_MATCH else KEYWISE, asked
        )
        if req.query_type == QueryType.QT_PREFIX_MATCH:
            raws = self.index.read_raw(
                ctx.layout, asked, MODE_PREFIX, servable=ctx.servable, covered=covered, feed=feed
            )
            # the prefix read stops at the first key it cannot serve: fewer raws than keys
            for i, (key, raw) in enumerate(zip(asked, raws, strict=False)):
                text = renderer.render(key, raw) if raw is not None else None
                if text is None and covered:
                    text = reported[i]
                if text is None:
                    break
                texts.append(text)
            hits = len(texts)
        else:
            mode = MODE_WINDOW if req.query_type == QueryType.QT_REVERSE_ROLL_SW_MATCH else MODE_BATCH
            raws = self.index.read_raw(ctx.layout, keys, mode, req.sw_size, ctx.servable, covered, feed)
            window = range(len(keys))
            if covered and mode == MODE_WINDOW:
                window = rightmost_window([r is not None or c for r, c in zip(raws, covered, strict=True)], req.sw_size)
            padding = renderer.padding()
            hits = 0
            for i, (key, raw) in enumerate(zip(keys, raws, strict=True)):
                text = renderer.render(key, raw) if raw is not None else None
                if text is None and covered and i in window:
                    text = reported[i]
                if text is None:
                    text = padding
                else:
                    hits += 1
                texts.append(text)
        tags = {"instance_id": ctx.instance_id}
        self.metrics.observe(_MATCH_METRICS[req.query_type], hits, tags)
        self.metrics.observe(_ASKED_METRICS[req.query_type], len(asked), tags)
        # UPSTREAM_V2 §2.16's names: hit rate = rate(hit) / rate(query).
        self.metrics.observe("manager.request_key_count", len(keys), tags)
        self.metrics.incr("manager.get_cache_location_query_block_counter", len(asked), tags)
        self.metrics.incr("manager.get_cache_location_hit_block_counter", hits, tags)
        if req.query_type == QueryType.QT_PREFIX_MATCH:
            self.metrics.observe("manager.prefix_match_time_us", (time.perf_counter() - started) * 1e6, tags)
        return GetCacheLocationResponse.model_construct(header=ResponseHeader(), locations=CacheLocations(texts))

    def stored_locations_by_type(
        self, instance_id: str, keys: list[int], storage_types: Sequence[StorageType]
    ) -> list[dict[StorageType, str]]:
        """Per key, the JSON of its first-ranked SERVING stored location on each of
        ``storage_types`` that holds one (getCacheLocationsByBackend: a key with copies on
        two tiers answers under each type). One batch read, one round trip."""
        ctx = self.contexts(instance_id)
        _require_a_servable_storage(ctx)
        renderer = self._renderer(ctx)
        feed = self.hit_feed.read(ctx.instance_id, KEYWISE, keys)
        raws = self.index.read_raw(ctx.layout, keys, MODE_BATCH, 0, ctx.servable, None, feed)
        out: list[dict[StorageType, str]] = []
        for key, raw in zip(keys, raws, strict=True):
            found: dict[StorageType, str] = {}
            if raw is not None:
                for storage_type in storage_types:
                    text = renderer.render(key, raw, storage_type=storage_type)
                    if text is not None:
                        found[storage_type] = text
            out.append(found)
        return out

    def _reported(
        self, ctx: InstanceContext, keys: list[int], names: frozenset[str] | None = None
    ) -> list[tuple[str, str, list[tuple[str, str]]] | None] | None:
        """Per key, the reported location served for it (event_reports.pick_reported) or
        None; None for all when the group has no event-report storage (no round trip)."""
        found = self.reported(ctx.instance_id, ctx.group, keys)
        if found is None:
            return None
        return [pick_reported(locs, names) if locs else None for locs in found]

    def _reported_texts(
        self, ctx: InstanceContext, keys: list[int], names: frozenset[str] | None
    ) -> list[str | None] | None:
        picked = self._reported(ctx, keys, names)
        if picked is None:
            return None
        return [reported_location_json(p[0], p[2]) if p is not None else None for p in picked]

    def _copies(
        self, ctx: InstanceContext, keys: list[int], renderer: LocationRenderer
    ) -> list[tuple[bytes | None, list[Copy], list[Reported]]]:
        """Per key: its record (None: none), every copy of it (the record's, then the visible
        reported ones), and those reported ones. Two round trips at most, nothing touched."""
        reported = self.reported(ctx.instance_id, ctx.group, keys) or [[] for _ in keys]
        out: list[tuple[bytes | None, list[Copy], list[Reported]]] = []
        for key, raw, others in zip(keys, self.index.read_raw(ctx.layout, keys, MODE_RAW), reported, strict=True):
            copies = stored_copies(renderer, key, raw, decode_record(raw)) if raw is not None else []
            out.append((raw, copies + reported_copies(others), others))
        return out

    def get_cache_meta(self, req: GetCacheMetaRequest) -> GetCacheMetaResponse:
        """Status and location id of every unmasked key (metas are JSON strings, as upstream):
        its stored location, else its visible reported one (upstream's location id); and,
        in ``replica_locations``, every copy of it (replicas.py)."""
        ctx = self.contexts(req.instance_id)
        keys = self._keys(ctx, req)
        flags = masked_flags(req.block_mask, len(keys), "block_mask")
        wanted = [k for k, masked in zip(keys, flags, strict=True) if not masked]
        renderer = self._renderer(ctx)
        # each key's location twice at least (first copy, and in its replicas)
        replica_extra = _REPLICA_ENVELOPE + _REPLICA_PER_SPEC * len(ctx.spec_layout.specs)
        self.bound_read_answer(ctx, req, len(wanted), renderer, _WIDEST_META + replica_extra, locations_per_key=2)
        padding = renderer.padding()
        texts, metas, replicas = [], [], []
        for key, (raw, copies, others) in zip(wanted, self._copies(ctx, wanted, renderer), strict=True):
            replicas.append(key_replicas(copies))
            record = decode_record(raw) if raw is not None else None
            picked = pick_reported(others) if others else None
            if (record is None or not record.locations) and picked is not None:
                metas.append(json.dumps({"id": picked[1], "status": CacheLocationStatus.CLS_SERVING.name}))
                texts.append(reported_location_json(picked[0], picked[2]))
                continue
            if raw is None or record is None or not record.locations:
                metas.append(json.dumps({"id": "", "status": CacheLocationStatus.CLS_NOT_FOUND.name}))
                texts.append(padding)
                continue
            loc = next(
                candidate
                for s in (Status.SERVING, Status.WRITING, Status.DELETING)
                for candidate in record.locations
                if candidate.status == s
            )
            metas.append(json.dumps({"id": str(loc.location_id), "status": WIRE_STATUS[loc.status].name}))
            texts.append(renderer.render(key, raw, ANY_STATUS) or padding)
        sizes = [
            len(text) + len(json.dumps(meta)) + len(render(replica)) + 3
            for text, meta, replica in zip(texts, metas, replicas, strict=True)
        ]
        refuse_oversized_answer(ctx, req, sum(sizes), max(sizes, default=0))
        return GetCacheMetaResponse(locations=CacheLocations(texts), metas=metas, replica_locations=replicas)

    def get_cache_meta_detail(self, req: GetCacheMetaDetailRequest) -> GetCacheMetaDetailResponse:
        """Every unmasked key's raw metadata (upstream's newest GetCacheMetaDetail): its
        position in the request, its parent, its record's header fields and every copy of it
        (replicas.py). A missing key has no locations; every item's status is OK (a failed
        read fails the whole call)."""
        ctx = self.contexts(req.instance_id)
        keys = self._keys(ctx, req)
        flags = masked_flags(req.block_mask, len(keys), "block_mask")
        wanted = [i for i, masked in enumerate(flags) if not masked]
        renderer = self._renderer(ctx)
        self.bound_read_answer(ctx, req, len(wanted), renderer, _DETAIL_ENVELOPE)
        found = self._copies(ctx, [keys[i] for i in wanted], renderer)
        items = [
            detail_item(i, keys[i], decode_record(raw) if raw is not None else None, copies)
            for i, (raw, copies, _) in zip(wanted, found, strict=True)
        ]
        sizes = [len(render(item)) + 1 for item in items]
        refuse_oversized_answer(ctx, req, sum(sizes), max(sizes, default=0))
        return GetCacheMetaDetailResponse(items=items)

    # ---------------------------------------------------------------- writes

    def _group_live_usage(self, ctx: InstanceContext, fresh: bool = False) -> Usage | None:
        """The group's live usage as this container last read it (None: the group has no
        quota, so it is never needed)."""
        quota = ctx.group.quota
        if quota is None or not (quota.capacity > 0 or any(q.capacity > 0 for q in quota.quota_config)):
            return None
        now = self.clock.now()
        cached = self._group_usage.get(ctx.group.name)
        if fresh or cached is None or not 0 <= now - cached[0] < GROUP_USAGE_MAX_AGE_S:
            cached = (now, self.index.group_usage([ctx.group.name])[0].live())
            self._group_usage[ctx.group.name] = cached
        return cached[1]

    def start_write_cache(self, req: StartWriteCacheRequest) -> StartWriteCacheResponse:
        """Reserve locations for the keys nobody has written yet (two-phase write, step 1):
        plan, try each candidate storage in turn, answer with the first grant."""
        plan = self._plan_start(req)
        refusals: list[str] = []
        for position in range(len(plan.candidates)):
            granted = self._try_candidate(plan, position, refusals)
            if granted is not None:
                return self._respond(plan, position, *granted)
        self.on_capacity_refused(plan.ctx.group.name)
        raise CapacityExceededError("no candidate storage can take the write: " + "; ".join(refusals))

    def _count_own_grant(self, ctx: InstanceContext, charge: Usage) -> None:
        """Add a grant to this container's copy of the group's usage: start.lua takes the
        other instances' part as the copy less the instance's own live bytes, so a copy
        missing the container's own last grants would let one client pass the quota."""
        cached = self._group_usage.get(ctx.group.name)
        if cached is not None:
            self._group_usage[ctx.group.name] = (cached[0], cached[1] + charge.live())

    def _plan_start(self, req: StartWriteCacheRequest) -> StartPlan:
        """What every candidate's try shares: the request checked, the candidates, the
        session, the stale locations."""
        ctx = self.contexts(req.instance_id)
        keys = self._keys(ctx, req)
        spec_groups = ctx.spec_layout.spec_groups_for(req.location_spec_group_names, len(keys))
        if req.write_timeout_seconds < 0:
            raise InvalidArgumentError("field 'write_timeout_seconds': must be >= 0")
        if req.min_replica_count < 0:
            raise InvalidArgumentError("field 'min_replica_count': must be >= 0")
        timeout_s = min(
            req.write_timeout_seconds or self.settings.default_write_timeout_s, self.settings.max_write_timeout_s
        )
        candidates = [s for s in ctx.write_candidates() if s.available]
        if not candidates:
            raise CapacityExceededError(f"instance group {ctx.group.name!r} has no available storage to write to")
        # One renderer for the size check and the response: its templates are built once.
        renderer = self._renderer(ctx)
        widths = location_widths(renderer, candidates, set(spec_groups))
        refuse_oversized_answer(ctx, req, sum(widths[g] for g in spec_groups), max(widths.values()))
        return StartPlan(
            ctx,
            keys,
            spec_groups,
            candidates,
            renderer,
            new_session_id(),
            int(self.clock.now() * 1000) + timeout_s * 1000,
            req.min_replica_count,
            self._stale_locations(ctx, keys) if self.settings.prune_stale_on_write else [],
            spec_group_coverage(ctx),
            req.caller,
        )

    def _try_candidate(
        self, plan: StartPlan, position: int, refusals: list[str]
    ) -> tuple[StartOutcome, list[int]] | None:
        """The start on candidate ``position`` (and those after it, for keys it cannot
        take), making room as ``self.room_policy`` says: the outcome and the explicit
        group ids reserved on the backend, or None (its refusal in ``refusals``) when
        the next candidate may take the write."""
        ctx, state = plan.ctx, plan.candidates[position]
        backend, sizes = state.backend, ctx.spec_layout.sizes
        try:
            explicit = backend.reserve(ctx.instance_id, len(plan.keys), sizes[0]) or []
        except CapacityExceededError as exc:  # a full memory pool: try the next candidate
            refusals.append(f"{state.name}: {exc}")
            return None
        last = position == len(plan.candidates) - 1

        tries = 0

        def attempt(partial: bool) -> StartOutcome:
            nonlocal tries
            tries += 1  # a retry reads the group's usage afresh: the room it was refused for moved
            request = self._start_request(plan, position, explicit, partial, fresh=tries > 1)
            return self.index.start(ctx.layout, plan.keys, request, feed=written_entry)

        def written_entry(outcome: StartOutcome) -> FeedEntry | None:
            return self.hit_feed.write([k for k, new in zip(plan.keys, outcome.new_flags, strict=True) if new])

        try:
            outcome = self.room_policy.start(
                attempt, lambda refusal, keep: self.make_room(ctx, refusal, keep), frozenset(plan.keys), last
            )
        except QuotaExceededError as exc:
            if explicit:
                backend.unreserve(ctx.instance_id, explicit, sizes[0])
            if exc.kind in (StartRefusal.SESSIONS, StartRefusal.CALLER_SESSIONS):
                raise
            if exc.kind not in (StartRefusal.TYPE, StartRefusal.STORAGES):  # no other candidate may take it
                self.on_capacity_refused(ctx.group.name)
                raise
            refusals.append(f"{state.name}: {exc}")
            return None
        return outcome, explicit

    def _start_request(
        self, plan: StartPlan, position: int, explicit: Sequence[int], partial: bool, fresh: bool
    ) -> StartRequest:
        """The start script's arguments for candidate ``position`` and the ones after it,
        with the group's usage as this container last read it (``fresh``: read now)."""
        ctx, state = plan.ctx, plan.candidates[position]
        group_usage = self._group_live_usage(ctx, fresh=fresh)
        return StartRequest(
            session_id=plan.session_id,
            deadline_ms=plan.deadline_ms,
            storage_name=state.name,
            storage_type=state.backend.storage_type.name,
            pack_count=state.backend.pack_count,
            sizes=ctx.spec_layout.sizes,
            spec_groups=plan.spec_groups,
            explicit_groups=explicit,
            group_capacity=ctx.group_capacity,
            type_capacity=ctx.type_capacity(state.backend.storage_type),
            max_keys=ctx.max_key_count,
            max_sessions=self.settings.max_write_sessions,
            caller=plan.caller,
            max_caller_sessions=self.settings.max_write_sessions_per_caller,
            group_usage=group_usage,
            instance_capacity=ctx.instance_capacity,
            min_replicas=plan.min_replicas,
            stale=plan.stale,
            covers=plan.covers,
            by_location=addresses_by_location(state.backend),
            more_candidates=[
                Candidate(
                    c.name,
                    c.storage_type.name,
                    c.backend.pack_count,
                    ctx.type_capacity(c.storage_type),
                    group_usage.by_type.get(c.storage_type.name, 0) if group_usage else -1,
                    addresses_by_location(c.backend),
                )
                for c in plan.further(position)
            ],
            partial=partial,
        )

    def _respond(
        self, plan: StartPlan, position: int, outcome: StartOutcome, explicit: list[int]
    ) -> StartWriteCacheResponse:
        """The granted start's answer: the unused explicit ids released, the stale
        locations handed to deletion, the locations rendered and prepared on storage."""
        ctx, state = plan.ctx, plan.candidates[position]
        self._count_own_grant(ctx, outcome.charge(state.backend.storage_type.name))
        record_marks(self.metrics, ctx, outcome.marks)
        self.metrics.observe("manager.write_new_keys", sum(outcome.new_flags), {"instance_id": ctx.instance_id})
        self.deleter.submit(ctx, list(outcome.victims))
        if explicit:
            unused = [g for g, c in zip(explicit, outcome.written_to or outcome.new_flags, strict=True) if c != 1]
            if unused:
                state.backend.unreserve(ctx.instance_id, unused, ctx.spec_layout.sizes[0])
        try:
            return self._start_response(plan, [state, *plan.further(position)], outcome, explicit)
        except Exception:
            # The grant is committed but the caller gets an error and never learns the
            # session id: fail the session now rather than leave its keys WRITING (and
            # blocked for other writers) until the deadline.
            self._fail_after_error(ctx, plan.session_id)
            raise

    def _start_response(
        self, plan: StartPlan, states: list[StorageState], outcome: StartOutcome, explicit: Sequence[int]
    ) -> StartWriteCacheResponse:
        """The written keys' locations, each on the candidate the start script chose
        (``states``: candidate 1, then the further candidates in order)."""
        ctx, keys, spec_groups, renderer = plan.ctx, plan.keys, plan.spec_groups, plan.renderer
        texts = []
        refs: dict[int, list[BlockRef]] = {}
        written = [
            (i, outcome.written_to[i] if outcome.written_to else 1) for i, new in enumerate(outcome.new_flags) if new
        ]
        for j, (location_id, group, slot) in enumerate(
            outcome.placements_of(written, [state.backend.pack_count for state in states], explicit)
        ):
            i, candidate = written[j]
            state = states[candidate - 1]
            ref = BlockRef(ctx.instance_id, keys[i], location_id, group, slot, ctx.spec_layout.slots(spec_groups[i]))
            refs.setdefault(candidate, []).append(ref)
            template, args = renderer.prepared(state, spec_groups[i])
            texts.append(template % args(keys[i], location_id, group, slot))
        for candidate, blocks in refs.items():
            states[candidate - 1].backend.prepare(blocks)
        return StartWriteCacheResponse(
            write_session_id=plan.session_id if written else new_session_id(writes=False),
            block_mask=mask_of([not new for new in outcome.new_flags]),
            locations=CacheLocations(texts),
        )

    def _stale_locations(self, ctx: InstanceContext, keys: list[int]) -> list[tuple[int, int]]:
        """(block key, location id) of the keys' SERVING locations whose storage reports their
        data missing (``StorageBackend.might_exist`` False; unknown counts as present): one
        read of the keys' records, then one batch probe per storage holding some."""
        by_storage: dict[int, list[BlockRef]] = {}
        for key, raw in zip(keys, self.index.read_raw(ctx.layout, keys, MODE_RAW), strict=True):
            record = decode_record(raw) if raw is not None else None
            for loc in record.locations if record is not None else ():
                if loc.status == Status.SERVING:
                    by_storage.setdefault(loc.storage_index, []).append(
                        BlockRef(
                            ctx.instance_id,
                            key,
                            loc.location_id,
                            loc.group_id,
                            loc.slot,
                            ctx.spec_layout.slots(loc.spec_group),
                        )
                    )
        stale = []
        for sidx, blocks in by_storage.items():
            backend = ctx.backend(self._storage_name(ctx, sidx))
            if backend is None:
                continue
            answers = backend.might_exist(blocks)
            stale += [
                (b.block_key, b.location_id) for b, present in zip(blocks, answers, strict=True) if present is False
            ]
        return stale

    def fail_session(self, ctx: InstanceContext, session_id: str) -> int | None:
        """Fail a write session now: its WRITING locations go to deletion and a later finish
        is refused. Returns how many locations, or None when the session is already gone
        (finished or failed meanwhile)."""
        session = self.index.session(ctx.layout, session_id)
        if session is None:
            return None
        try:
            failed = self.index.finish(ctx.layout, session_id, session, (), ctx.spec_layout.sizes, force_fail=True)
        except WriteSessionError:
            return None  # finished between the read and the finish
        self.deleter.submit(ctx, failed.victims)
        return len(failed.victims)

    def _fail_after_error(self, ctx: InstanceContext, session_id: str) -> None:
        try:
            self.fail_session(ctx, session_id)
        # The reaper fails it at the deadline; the start's own error is the one to report.
        except Exception as exc:  # noqa: BLE001
            logger.warning(
                "could not fail the write session of a failed start",
                extra={"write_session_id": session_id, "error": str(exc)},
            )

    def finish_write_cache(self, req: FinishWriteCacheRequest) -> FinishWriteCacheResponse:
        """Close a write session: successful blocks start serving, the rest are deleted.
        Blocks reported successful that a removal took while WRITING are named in
        ``uncommitted_blocks`` (and the message): they will not be served."""
        ctx = self.contexts(req.instance_id)
        if not req.write_session_id:
            raise InvalidArgumentError("field 'write_session_id' is required")
        if req.success_blocks is None:
            raise InvalidArgumentError("field 'success_blocks' is required")
        session = self.index.session(ctx.layout, req.write_session_id)
        if session is None and is_empty_session_id(req.write_session_id):
            masked_flags(req.success_blocks, 0, "success_blocks")  # a start that wrote no key
            return FinishWriteCacheResponse()
        if session is None:
            raise WriteSessionError(
                f"write session {req.write_session_id!r} of instance {req.instance_id!r} "
                f"is unknown, finished or expired"
            )
        success = masked_flags(req.success_blocks, len(session.entries), "success_blocks")
        finished = self.index.finish(
            ctx.layout, req.write_session_id, session, success, ctx.spec_layout.sizes, mark_clear=mark_clearing(ctx)
        )
        record_marks(self.metrics, ctx, finished.marks)
        self.deleter.submit(ctx, finished.victims)
        if finished.expired:
            raise WriteSessionError(f"write session {req.write_session_id!r} expired before it was finished")
        if not finished.uncommitted:
            return FinishWriteCacheResponse()
        taken = set(finished.uncommitted)
        return FinishWriteCacheResponse(
            header=ResponseHeader(
                status=WireStatus(
                    message=f"{len(taken)} of the session's blocks were removed while WRITING and are not "
                    f"committed (positions {sorted(taken)[:16]}): they will not be served"
                )
            ),
            uncommitted_blocks=BlockMask(bool_masks=BoolMasks(values=[j in taken for j in range(len(success))])),
        )

    # ---------------------------------------------------------------- removal

    def remove_cache(self, req: RemoveCacheRequest) -> Response:
        """Every location of the keys stops serving now; deletion follows asynchronously."""
        ctx = self.contexts(req.instance_id)
        keys = self._keys(ctx, req)
        flags = masked_flags(req.block_mask, len(keys), "block_mask")
        delay_ms = ctx.delete_delay_ms
        victims = self.index.mark_deleting(
            ctx.layout,
            [k for k, m in zip(keys, flags, strict=True) if not m],
            ctx.spec_layout.sizes,
            resubmit_before_s=int(self.clock.now()),
            delay_ms=delay_ms,
        )
        self.deleter.submit(ctx, victims, delay_ms)
        return Response()

    def trim_cache(self, req: TrimCacheRequest) -> Response:
        """REMOVE_ALL_CACHE (every block written before the call), TIMESTAMP (blocks
        written in [begin, end] µs) or REMOVE_ALL_META (records forgotten, data left on
        storage and charged): a purge, inline for a small instance, in the state machine
        for a large one (see ``purge``)."""
        ctx = self.contexts(req.instance_id)
        if req.strategy == TrimStrategy.TS_UNSPECIFIED:
            raise InvalidArgumentError("field 'strategy' is required")
        if req.strategy == TrimStrategy.TS_REMOVE_ALL_META:
            self.purge.trim(ctx, META)
            return Response()
        if req.strategy == TrimStrategy.TS_TIMESTAMP and req.begin_timestamp > req.end_timestamp:
            raise InvalidArgumentError("field 'begin_timestamp': must not be after end_timestamp")
        written = (
            (req.begin_timestamp, req.end_timestamp)
            if req.strategy == TrimStrategy.TS_TIMESTAMP
            else (0, now_us(self.clock))
        )
        self.purge.trim(ctx, CACHE, written)
        return Response()
