"""getCacheLocationsByBackend (UPSTREAM_V2 §2.5): per key, at most one location per
selected backend type, for clients that fetch from one tier each.

Stored locations (storages written through startWriteCache) come from one batch read of
the records: per selected type, the key's first-ranked SERVING copy of that type (the
group's tier order, then read weight: docs/tiered-storage.md), so a key with copies on two
tiers answers under each type. Reported locations (ST_EVENT_REPORT_*) come from the
reporters' visible locations; L2 peers may be chosen for a whole prompt (LSS_V6D_PREFIX:
the peer holding the longest run from the first key; LSS_V6D_COVERAGE: the peer holding
the most keys; ties to the smallest address).
"""

from __future__ import annotations

import json
import random
from collections import Counter

from ..control.config_cache import ConfigCache
from ..protocol.block_keys import request_keys
from ..protocol.codes import LocationSelectStrategy, QueryType, StorageType
from ..protocol.errors import InvalidArgumentError
from ..protocol.models import (
    EVENT_REPORT_TYPES,
    CacheLocation,
    CacheLocationVector,
    GetCacheLocationsByBackendRequest,
    GetCacheLocationsByBackendResponse,
)
from ..stores.reporters import RID_TYPES
from .event_reports import EventReports, Reported, merge_specs
from .masks import masked_flags
from .service import CacheService

_V6D = (LocationSelectStrategy.LSS_V6D_PREFIX, LocationSelectStrategy.LSS_V6D_COVERAGE)


#: A key's empty vector in the answer, with its comma.
_VECTOR_ENVELOPE = len('{"locations":[]}') + 1


def _check_selectors(req: GetCacheLocationsByBackendRequest) -> None:
    if not req.backend_selectors:
        raise InvalidArgumentError("field 'backend_selectors' must not be empty")
    seen = set()
    for i, selector in enumerate(req.backend_selectors):
        where = f"backend_selectors[{i}]"
        if selector.backend_type == StorageType.ST_UNSPECIFIED:
            raise InvalidArgumentError(f"field '{where}.backend_type' is required")
        if selector.backend_type in seen:
            raise InvalidArgumentError(f"field '{where}.backend_type': {selector.backend_type.name} appears twice")
        seen.add(selector.backend_type)
        if selector.strategy == LocationSelectStrategy.LSS_WEIGHTED_RANDOM:
            continue
        if selector.strategy in _V6D and selector.backend_type == StorageType.ST_EVENT_REPORT_L2:
            continue
        raise InvalidArgumentError(
            f"field '{where}.strategy': {selector.strategy.name} is not allowed for "
            f"{selector.backend_type.name} (LSS_WEIGHTED_RANDOM for any type, "
            f"LSS_V6D_PREFIX/LSS_V6D_COVERAGE for ST_EVENT_REPORT_L2)"
        )


def _location(type_name: str, specs: list[tuple[str, str]], name: str | None) -> CacheLocation | None:
    """A wire location of ``specs`` projected to ``name`` (None: nothing left)."""
    if name is not None:
        specs = [(n, u) for n, u in specs if n == name]
    specs = [(n, u) for n, u in specs if u]
    if not specs:
        return None
    return {"type": type_name, "spec_size": len(specs), "location_specs": [{"name": n, "uri": u} for n, u in specs]}


def _peer(specs: list[tuple[str, str]]) -> str:
    """host:port of a reported location: the authority of its first URI."""
    return specs[0][1].split("://", 1)[1].split("/", 1)[0].split("?", 1)[0]


def _pick_peer(per_key: list[dict[str, list[Reported]]], strategy: LocationSelectStrategy) -> tuple[str, list[int]]:
    """(the chosen peer, the indexes of the keys it covers) of a V6D strategy."""
    if strategy == LocationSelectStrategy.LSS_V6D_PREFIX:
        runs: Counter[str] = Counter()
        alive = set(per_key[0]) if per_key else set()
        for peers in per_key:
            alive &= set(peers)
            if not alive:
                break
            runs.update(alive)
        if not runs:
            return "", []
        peer = min(runs, key=lambda p: (-runs[p], p))
        return peer, list(range(runs[peer]))
    counts = Counter(p for peers in per_key for p in peers)
    if not counts:
        return "", []
    peer = min(counts, key=lambda p: (-counts[p], p))
    return peer, [i for i, peers in enumerate(per_key) if peer in peers]


class BackendLocations:
    """getCacheLocationsByBackend over the cache's reads and the engines' reports."""

    def __init__(
        self, config: ConfigCache, cache: CacheService, reports: EventReports, max_keys_per_request: int
    ) -> None:
        self.config = config
        self.cache = cache
        self.reports = reports
        self.max_keys_per_request = max_keys_per_request

    def get_cache_locations_by_backend(
        self, req: GetCacheLocationsByBackendRequest
    ) -> GetCacheLocationsByBackendResponse:
        """Per key, at most one location of each selected backend type, in selector order."""
        if not req.instance_id:
            raise InvalidArgumentError("field 'instance_id' is required")
        if req.query_type != QueryType.QT_BATCH_GET:
            raise InvalidArgumentError("field 'query_type': GetCacheLocationsByBackend only supports QT_BATCH_GET")
        _check_selectors(req)
        record = self.config.instance(req.instance_id)
        keys = request_keys(
            req.block_keys, req.token_ids, record.block_key_scheme, record.block_size, self.max_keys_per_request
        )
        masked = masked_flags(req.block_mask, len(keys), "block_mask")
        names: list[str | None] = [None] * len(keys)
        if req.location_spec_names:
            if len(req.location_spec_names) != len(keys) or not all(req.location_spec_names):
                raise InvalidArgumentError(
                    "field 'location_spec_names' must be empty or contain one non-empty name per query key"
                )
            names = list(req.location_spec_names)
        wanted = [i for i, m in enumerate(masked) if not m]
        stored_types = [s.backend_type for s in req.backend_selectors if s.backend_type not in EVENT_REPORT_TYPES]
        # Each key's vector holds at most one stored location per stored type selected.
        # Reported ones are the engines' URIs, which the instance's layout does not bound:
        # not counted.
        self.cache.bound_read_answer(
            self.cache.contexts(req.instance_id),
            req,
            len(keys),
            per_key_extra=_VECTOR_ENVELOPE,
            locations_per_key=max(1, len(stored_types)),
        )
        vectors: list[list[CacheLocation]] = [[] for _ in keys]
        stored: dict[int, dict[StorageType, str]] = {}
        if stored_types and wanted:
            found = self.cache.stored_locations_by_type(req.instance_id, [keys[i] for i in wanted], stored_types)
            stored = dict(zip(wanted, found, strict=True))
        reported: list[list[Reported]] = []
        if any(s.backend_type in EVENT_REPORT_TYPES for s in req.backend_selectors) and wanted:
            reported = self.reports.visible_locations(
                req.instance_id, [keys[i] for i in wanted], self.config.group(record.group)
            )
        for selector in req.backend_selectors:
            type_name = selector.backend_type.name
            if selector.backend_type not in EVENT_REPORT_TYPES:
                for i, by_type in stored.items():
                    if selector.backend_type in by_type:
                        location = json.loads(by_type[selector.backend_type])
                        specs = [(s["name"], s["uri"]) for s in location["location_specs"]]
                        picked = _location(type_name, specs, names[i])
                        if picked is not None:
                            vectors[i].append(picked)
                continue
            kind = RID_TYPES[selector.backend_type]
            # Each key's candidates: this type's locations holding the key's requested spec.
            candidates = [
                [
                    loc
                    for loc in per_key
                    if loc[0].partition("#")[0] == kind and _location(type_name, loc[3], names[i]) is not None
                ]
                for i, per_key in zip(wanted, reported, strict=True)
            ]
            if selector.strategy == LocationSelectStrategy.LSS_WEIGHTED_RANDOM:
                for i, locs in zip(wanted, candidates, strict=True):
                    if locs:
                        host = random.choice(locs)[0]
                        picked = _location(type_name, merge_specs([loc for loc in locs if loc[0] == host]), names[i])
                        if picked is not None:
                            vectors[i].append(picked)
                continue
            by_peer: list[dict[str, list[Reported]]] = [{} for _ in candidates]
            for peers, locs in zip(by_peer, candidates, strict=True):
                for loc in locs:
                    peers.setdefault(_peer(loc[3]), []).append(loc)
            peer, covered = _pick_peer(by_peer, selector.strategy)
            for j in covered:
                i = wanted[j]
                picked = _location(type_name, merge_specs(by_peer[j][peer]), names[i])
                if picked is not None:
                    vectors[i].append(picked)
        return GetCacheLocationsByBackendResponse(key_locations=[CacheLocationVector(locations=v) for v in vectors])
