"""getCacheLocationLen (UPSTREAM_V2 §2.3): how many of the keys a read would find.

It runs getCacheLocation's query with no block mask and counts, as upstream does:
QT_BATCH_GET and QT_REVERSE_ROLL_SW_MATCH count the returned locations holding at least
one URI (hits anywhere), QT_PREFIX_MATCH the matched prefix; any other query type counts
0 (upstream's switch has no case for it). QT_UNSPECIFIED is refused, with no fallback to
the instance's ``default_query_type`` (INVALID_ARGUMENT naming the field, where upstream
answers INTERNAL_ERROR "unknown query type").
"""

from __future__ import annotations

from ..protocol.codes import QueryType
from ..protocol.errors import InvalidArgumentError
from ..protocol.models import (
    CacheLocation,
    GetCacheLocationLenRequest,
    GetCacheLocationLenResponse,
    GetCacheLocationRequest,
)
from .service import CacheService

_COUNTED = (QueryType.QT_BATCH_GET, QueryType.QT_PREFIX_MATCH, QueryType.QT_REVERSE_ROLL_SW_MATCH)


def _has_uri(location: CacheLocation) -> bool:
    return any(spec["uri"] for spec in location["location_specs"])


def get_cache_location_len(cache: CacheService, req: GetCacheLocationLenRequest) -> GetCacheLocationLenResponse:
    """The number of cached blocks among the request's keys (a prefix length for QT_PREFIX_MATCH)."""
    if not req.instance_id:
        raise InvalidArgumentError("field 'instance_id' is required")
    if not req.block_keys and not req.token_ids:
        raise InvalidArgumentError("field 'block_keys' or 'token_ids' is required")
    if req.query_type == QueryType.QT_UNSPECIFIED:
        raise InvalidArgumentError("field 'query_type': unknown query type")
    if req.query_type not in _COUNTED:
        return GetCacheLocationLenResponse(cache_location_len=0)
    found = cache.get_cache_location(
        GetCacheLocationRequest(
            trace_id=req.trace_id,
            instance_id=req.instance_id,
            block_keys=req.block_keys,
            token_ids=req.token_ids,
            query_type=req.query_type,
            sw_size=req.sw_size,
        ),
        bounded=False,  # the answer is one count, whatever the locations' size
    )
    if req.query_type == QueryType.QT_PREFIX_MATCH:
        return GetCacheLocationLenResponse(cache_location_len=len(found.locations))
    return GetCacheLocationLenResponse(cache_location_len=sum(map(_has_uri, found.locations)))
