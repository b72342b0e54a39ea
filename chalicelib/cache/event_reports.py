"""reportEvent and getHostCacheState (UPSTREAM_V2 §2.1, §2.2): engines report the blocks
they hold, routers ask which host holds the longest prefix of a prompt.

The request rules run here, in upstream's order and before anything changes; the events
themselves are applied by one script per request (``stores.reporters``).
"""

from __future__ import annotations

import json
import random
import re
import time
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache

from ..clock import Clock, now_ms
from ..control.config_cache import ConfigCache
from ..control.records import InstanceRecord
from ..observability.metrics import MetricsRegistry
from ..protocol.codes import ErrorCode, QueryType, ReportEventType, StorageType
from ..protocol.errors import InstanceNotFoundError, InvalidArgumentError
from ..protocol.models import (
    EVENT_PAYLOADS,
    EVENT_REPORT_TYPES,
    EventReportStorageSpec,
    GetHostCacheStateRequest,
    GetHostCacheStateResponse,
    HostCacheMatch,
    InstanceGroup,
    ReportEventRequest,
    ReportEventResponse,
    ResponseHeader,
    Status,
    StorageConfig,
)
from ..protocol.reported_events import Event as ReportedEvent
from ..protocol.reported_events import Spec
from ..storage.checks import spec_of
from ..stores.reporters import (
    RID_TYPES,
    Event,
    Liveness,
    ReporterStore,
    add_event_at,
    delete_event,
    heartbeat_event,
    host_down_event,
    register_event,
    reporter_id,
    snapshot_event,
)

_INT64 = (-(1 << 63), (1 << 63) - 1)
#: ``scheme://authority[/path][?query]``; schemes may hold '_' (upstream's ``event_report://``).
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.\-_]*://[^/?#\s]+[^?#\s]*(?:\?([^#\s]*))?")
#: The start of a ``_URI`` after a newline: scheme, ``://`` and the authority's first character.
_URI_STARTS = re.compile(r"\n[A-Za-z][A-Za-z0-9+.\-_]*://[^/?#\s]")
_DELTAS = (ReportEventType.EVENT_BLOCK_ADD, ReportEventType.EVENT_BLOCK_DELETE)
_ADD = ReportEventType.EVENT_BLOCK_ADD.name
#: Spec-group name initials (QT_PREFIX_MATCH_WITH_MAMBA): F full attention, L linear/Mamba state.
_UNSUPPORTED_GROUP_KINDS = "WCEX"
#: A reported location: (rid, location id, medium, [(spec, uri)]).
Reported = tuple[str, str, str, list[tuple[str, str]]]


_TYPE_OF_KIND = {kind: storage_type.name for storage_type, kind in RID_TYPES.items()}


def reported_type_name(rid: str) -> str:
    """The wire storage type name of a reporter's locations."""
    return _TYPE_OF_KIND[rid.partition("#")[0]]


def merge_specs(locations: list[Reported]) -> list[tuple[str, str]]:
    """The specs of several reported locations (one reporter's media), first URI per name."""
    merged: dict[str, str] = {}
    for _, _, _, specs in locations:
        for name, uri in specs:
            merged.setdefault(name, uri)
    return list(merged.items())


def pick_reported(
    locations: list[Reported], names: frozenset[str] | None = None
) -> tuple[str, str, list[tuple[str, str]]] | None:
    """One key's reported location as getCacheLocation serves it: (wire type name, location
    id, specs), or None when no reporter holds a spec of ``names`` (None: any). As upstream's
    weighted pick among backends with equal weights: a reporter at random, its media merged."""
    if names is not None:
        locations = [(rid, lid, medium, [s for s in specs if s[0] in names]) for rid, lid, medium, specs in locations]
    holders = sorted({rid for rid, _, _, specs in locations if specs})
    if not holders:
        return None
    rid = holders[0] if len(holders) == 1 else random.choice(holders)
    own = [loc for loc in locations if loc[0] == rid and loc[3]]
    return reported_type_name(rid), own[0][1], merge_specs(own)


def reported_location_json(type_name: str, specs: list[tuple[str, str]]) -> str:
    """A reported location as wire JSON text (the shape LocationRenderer prints)."""
    return json.dumps(
        {"type": type_name, "spec_size": len(specs), "location_specs": [{"name": n, "uri": u} for n, u in specs]},
        separators=(",", ":"),
    )


class ItemError(Exception):
    """One event is invalid: it gets INVALID_ARGUMENT, the others go on."""


# ---------------------------------------------------------------- configuration


def liveness_of(config: StorageConfig) -> Liveness:
    """The storage's settings, upstream's defaults for those left at 0."""
    spec: EventReportStorageSpec = spec_of(config, "event_report")
    default = Liveness()
    return Liveness(
        heartbeat_timeout_ms=spec.heartbeat_timeout_ms or default.heartbeat_timeout_ms,
        cleanup_grace_ms=spec.cleanup_grace_ms or default.cleanup_grace_ms,
        snapshot_min_interval_ms=spec.snapshot_min_interval_ms or default.snapshot_min_interval_ms,
    )


# ---------------------------------------------------------------- item checks


def _name(value: str, what: str) -> str:
    if not value or "#" in value:
        raise ItemError(f"{what} must be non-empty without '#'")
    return value


def _block_key(text: str, what: str) -> int:
    try:
        key = int(text, 10)
    except (TypeError, ValueError):
        raise ItemError(f"{what} {text!r} is not an int64 decimal string") from None
    if not _INT64[0] <= key <= _INT64[1] or text.strip() != text:
        raise ItemError(f"{what} {text!r} is not an int64 decimal string")
    return key


@lru_cache(maxsize=1024)
def _names_problem(names: tuple[str, ...]) -> str | None:
    """What is wrong with a location's spec names (a batch's events mostly share them)."""
    if not names:
        return "specs must not be empty"
    for i, name in enumerate(names):
        if not name or name in names[:i]:
            return f"specs[{i}].name must be non-empty and unique"
    return None


def _check_uris(uris: list[str]) -> None:
    for i, text in enumerate(uris):
        uri = _URI.fullmatch(text)
        if uri is None:
            raise ItemError(f"specs[{i}].uri {text!r} is not a URI")
        if any(pair.split("=", 1)[0] == "s_version" for pair in (uri.group(1) or "").split("&")):
            raise ItemError(f"specs[{i}].uri carries s_version, which KVCM appends")


def _uris_valid(events: Sequence[ReportedEvent]) -> bool:
    """Whether every ADD's spec URIs pass ``_check_uris``, checked over all of them at once
    (a regex per URI costs 1 µs). Joined by newlines, they must hold no whitespace but those
    (``split``), no ``#`` and no ``s_version``; then a URI is valid exactly when it starts
    with a scheme, ``://`` and an authority character, which one search counts."""
    uris = [spec.uri for event in events if (add := event.block_add) is not None for spec in add.specs]
    lines = "\n" + "\n".join(uris)
    return (
        len(lines.split()) == len(uris)
        and "#" not in lines
        and "s_version" not in lines
        and len(_URI_STARTS.findall(lines)) == len(uris)
    )


def _specs(specs: list[Spec]) -> tuple[tuple[str, ...], list[str]]:
    """A snapshot block's (spec names, URIs), checked. ItemError names the spec relative to
    the block (the caller prefixes its path)."""
    names, uris = tuple([spec.name for spec in specs]), [spec.uri for spec in specs]
    problem = _names_problem(names)
    if problem is not None:
        raise ItemError(problem)
    _check_uris(uris)
    return names, uris


def _payload[P](payload: P | None) -> P:
    """A payload ``_encode`` found present."""
    if payload is None:
        raise AssertionError("an event without its payload got through")
    return payload


def _encode(item: ReportedEvent, i: int, uris_valid: bool) -> Event:
    """The script's encoding of a valid item; ItemError names what is wrong.
    ``uris_valid``: every ADD's URIs were found valid in bulk."""
    add = item.block_add
    if add is not None and item.event_type == _ADD:  # nearly every event: first, by its name
        try:  # the paths are prefixed on failure only: no string is built per valid event
            medium = add.medium
            if not medium or "#" in medium:
                raise ItemError("medium must be non-empty without '#'")
            location = [medium]  # reporters.location_fields, built as the specs are read
            for spec in add.specs:
                location += (spec.name, spec.uri)
            names = tuple(location[1::2])
            problem = _names_problem(names)
            if problem is not None:
                raise ItemError(problem)
            if not uris_valid:
                _check_uris(location[2::2])
            return add_event_at(_block_key(add.block_key, "block_key"), names, location)
        except ItemError as err:
            raise ItemError(f"events[{i}].block_add.{err}") from None
    kind = item.kind
    what = f"events[{i}]"
    member = EVENT_PAYLOADS.get(kind)
    if member is None or getattr(item, member) is None:
        raise ItemError(f"{what}: event_type {kind.name} needs its own payload")
    if kind == ReportEventType.EVENT_NODE_REGISTER:
        return register_event(
            [_name(m, f"{what}.node_register.mediums[{j}]") for j, m in enumerate(_payload(item.node_register).mediums)]
        )
    if kind == ReportEventType.EVENT_HEARTBEAT:
        return heartbeat_event()
    if kind == ReportEventType.EVENT_HOST_DOWN:
        return host_down_event()
    if kind == ReportEventType.EVENT_BLOCK_DELETE:
        delete = _payload(item.block_delete)
        key = _block_key(delete.block_key, f"{what}.block_delete.block_key")
        medium = _name(delete.medium, f"{what}.block_delete.medium")
        if not delete.spec_names or len(set(delete.spec_names)) != len(delete.spec_names) or not all(delete.spec_names):
            raise ItemError(f"{what}.block_delete.spec_names must be non-empty, unique names")
        return delete_event(key, medium, delete.spec_names)
    blocks, seen = [], set()
    for j, block in enumerate(_payload(item.block_snapshot).blocks):
        where = f"{what}.block_snapshot.blocks[{j}]"
        key, medium = _block_key(block.block_key, f"{where}.block_key"), _name(block.medium, f"{where}.medium")
        if (key, medium) in seen:
            raise ItemError(f"{where}: block_key {key} and medium {medium!r} appear twice")
        seen.add((key, medium))
        try:
            names, uris = _specs(block.specs)
        except ItemError as err:
            raise ItemError(f"{where}.{err}") from None
        blocks.append((key, medium, list(zip(names, uris, strict=True))))
    return snapshot_event(blocks)


def encode_events(events: Sequence[ReportedEvent]) -> tuple[list[ErrorCode | None], list[Event]]:
    """(per event: INVALID_ARGUMENT or None for a valid one, the valid ones as the report
    script reads them)."""
    codes: list[ErrorCode | None] = []
    encoded = []
    uris_valid = _uris_valid(events)
    for i, item in enumerate(events):
        try:
            encoded.append(_encode(item, i, uris_valid))
            codes.append(None)
        except ItemError:
            codes.append(ErrorCode.INVALID_ARGUMENT)
    return codes, encoded


def _check_shape(kinds: list[ReportEventType]) -> None:
    """Rule 5: one SNAPSHOT at most, never with ADD/DELETE; HOST_DOWN alone."""
    snapshots = kinds.count(ReportEventType.EVENT_BLOCK_SNAPSHOT)
    if snapshots > 1:
        raise InvalidArgumentError("field 'events': at most one EVENT_BLOCK_SNAPSHOT per request")
    if snapshots and any(k in _DELTAS for k in kinds):
        raise InvalidArgumentError("field 'events': EVENT_BLOCK_SNAPSHOT cannot be mixed with ADD or DELETE")
    if ReportEventType.EVENT_HOST_DOWN in kinds and len(kinds) > 1:
        raise InvalidArgumentError("field 'events': EVENT_HOST_DOWN must be the only event")


def _mamba_specs(record: InstanceRecord) -> tuple[list[str], list[str]]:
    full, states = [], []
    for group in record.location_spec_groups:
        kind = group.name[:1]
        if kind == "F":
            full += group.spec_names
        elif kind == "L":
            states += group.spec_names
        elif kind and kind in _UNSUPPORTED_GROUP_KINDS:
            raise InvalidArgumentError(
                f"field 'query_type': location spec group {group.name!r} is of an "
                f"unsupported kind for QT_PREFIX_MATCH_WITH_MAMBA"
            )
        else:
            raise InvalidArgumentError(
                f"field 'query_type': location spec group {group.name!r} is neither F (full attention) nor L (state)"
            )
    if not full or not states:
        raise InvalidArgumentError("field 'query_type': QT_PREFIX_MATCH_WITH_MAMBA needs F and L location spec groups")
    return full, states


# ---------------------------------------------------------------- the service


class EventReports:
    """reportEvent and getHostCacheState over the reporters' store, and the reported
    locations other reads merge (getCacheLocationsByBackend)."""

    def __init__(
        self,
        config: ConfigCache,
        reporters: ReporterStore,
        metrics: MetricsRegistry,
        clock: Clock,
    ) -> None:
        self.config = config
        self.reporters = reporters
        self.metrics = metrics
        self.clock = clock

    def storages(self, group: InstanceGroup) -> dict[StorageType, StorageConfig]:
        """StorageType → the group's event-report storage config of that type."""
        found: dict[StorageType, StorageConfig] = {}
        for name in group.event_report_storage_candidates:
            try:
                config = self.config.storage(name).config
            except Exception:  # noqa: BLE001 - a candidate removed since: not configured
                continue
            if config.event_report is not None and config.storage_type in EVENT_REPORT_TYPES:
                found.setdefault(config.storage_type, config)
        return found

    def heartbeat_timeouts(self, group: InstanceGroup) -> dict[str, int]:
        """Reporter kind (``l1p5``, ``l2``) → its heartbeat timeout in the group (ms)."""
        return {
            RID_TYPES[kind]: liveness_of(config).heartbeat_timeout_ms for kind, config in self.storages(group).items()
        }

    def visible_locations(self, instance_id: str, keys: list[int], group: InstanceGroup) -> list[list[Reported]]:
        """Per key, its reported locations whose reporters are alive."""
        return self.reporters.visible_locations(instance_id, keys, now_ms(self.clock), self.heartbeat_timeouts(group))

    def visible_if_configured(
        self, instance_id: str, group: InstanceGroup, keys: list[int]
    ) -> list[list[Reported]] | None:
        """``visible_locations``, or None without a round trip when the group has no
        event-report storage (nothing can be reported for its instances)."""
        timeouts = self.heartbeat_timeouts(group)
        if not timeouts or not keys:
            return None
        return self.reporters.visible_locations(instance_id, keys, now_ms(self.clock), timeouts)

    def _count(
        self,
        req: ReportEventRequest,
        group: str,
        kinds: list[ReportEventType],
        results: list[ErrorCode],
        started: float,
    ) -> None:
        """upstream's ``event_report.*`` metrics (UPSTREAM_V2 §2.1), per event type."""
        tags = {"instance_group": group, "instance_id": req.instance_id, "type": req.storage_type.name[3:].lower()}
        requests = Counter(kinds)
        errors = Counter(kind for kind, code in zip(kinds, results, strict=True) if code != ErrorCode.OK)
        for kind, count in requests.items():
            event_tags = {**tags, "event_type": kind.name}
            self.metrics.incr("event_report.request_counter", count, event_tags)
            if errors[kind]:
                self.metrics.incr("event_report.error_counter", errors[kind], event_tags)
        self.metrics.observe("event_report.request_rt_us", (time.perf_counter() - started) * 1e6, tags)

    def report_event(self, req: ReportEventRequest) -> ReportEventResponse:
        """Apply an engine's cache events (register, heartbeat, add, delete, snapshot, host down)."""
        started = time.perf_counter()
        if not req.instance_id:
            raise InstanceNotFoundError("instance '' is not registered")
        record = self.config.instance(req.instance_id)  # rule 1
        group = self.config.group(record.group)
        if not req.host_ip_port or "#" in req.host_ip_port:  # rule 2
            raise InvalidArgumentError("field 'host_ip_port' must be non-empty without '#'")
        if not req.events:  # rule 3
            return ReportEventResponse(extra_info=group.extra_info)
        if req.storage_type not in EVENT_REPORT_TYPES:  # rule 4
            raise InvalidArgumentError("field 'storage_type' must be ST_EVENT_REPORT_L1P5 or ST_EVENT_REPORT_L2")
        storage = self.storages(group).get(req.storage_type)
        if storage is None:
            raise InstanceNotFoundError(
                f"instance group {group.name!r} has no {req.storage_type.name} storage "
                f"in event_report_storage_candidates"
            )
        kinds = [event.kind for event in req.events]
        _check_shape(kinds)  # rule 5
        codes, encoded = encode_events(req.events)  # rule 6
        rid = reporter_id(req.storage_type, req.host_ip_port)
        outcome = self.reporters.report(req.instance_id, rid, encoded, now_ms(self.clock), liveness_of(storage))
        applied = iter(outcome.codes)
        results = [code if code is not None else next(applied) for code in codes]
        self._count(req, group.name, kinds, results, started)
        response = ReportEventResponse(
            committed_snapshot_version=outcome.generation,
            snapshot_required=outcome.snapshot_required,
            retry_after_ms=outcome.retry_after_ms,
            extra_info=group.extra_info,
        )
        failed = [code for code in results if code != ErrorCode.OK]
        if failed:
            response.item_results = results
            response.header = ResponseHeader(status=Status(code=failed[0], message="ReportEvent partially failed"))
        return response

    def get_host_cache_state(self, req: GetHostCacheStateRequest) -> GetHostCacheStateResponse:
        """Per reporting host, how many leading blocks of the prompt it holds (cache-aware routing)."""
        if not req.instance_id:
            raise InvalidArgumentError("field 'instance_id' is required")
        if not req.block_cache_keys:
            raise InvalidArgumentError("field 'block_cache_keys' is required")
        record = self.config.instance(req.instance_id)
        # Unset in the request: the instance's registered default, else a prefix match.
        query_type = req.query_type or record.default_query_type or QueryType.QT_PREFIX_MATCH
        if query_type not in (QueryType.QT_PREFIX_MATCH, QueryType.QT_PREFIX_MATCH_WITH_MAMBA):
            raise InvalidArgumentError(
                f"field 'query_type': {query_type.name} is not QT_PREFIX_MATCH or QT_PREFIX_MATCH_WITH_MAMBA"
            )
        mamba = _mamba_specs(record) if query_type == QueryType.QT_PREFIX_MATCH_WITH_MAMBA else None
        timeouts = self.heartbeat_timeouts(self.config.group(record.group))
        prefixes = self.reporters.host_prefixes(
            req.instance_id,
            req.block_cache_keys,
            now_ms(self.clock),
            timeouts,
            req.medium,
            mamba,
            record.model_deployment.use_eagle_pop,
        )
        # In host order, whatever the prefixes, as upstream lists its candidate hosts.
        return GetHostCacheStateResponse(
            hosts=[
                HostCacheMatch(host_ip_port=host, prefix_match_blocks=n, local=n, p2p_1_total_match=n)
                for host, n in sorted(prefixes.items())
            ]
        )
