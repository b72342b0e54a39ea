"""MetaService methods (registerInstance, getInstanceInfo, getCacheMeta and removeCache
are AdminService methods too; they are served once, here)."""

from __future__ import annotations

from ..auth import Action as A
from ..auth import targets as t
from ..auth.targets import TargetOf
from ..protocol import models as m
from ..protocol.models import Request
from ..services.meta import MetaService as S
from .api import api_blueprint
from .dispatch import Handler, Operation


def _meta(
    name: str, request_model: type[Request], handler: Handler, action: A = A.META_WRITE, target: TargetOf = t.instance
) -> Operation:
    return Operation(name, request_model, handler, service="meta", action=action, target=target, recorded=True)


OPERATIONS: list[Operation] = [
    _meta("registerInstance", m.RegisterInstanceRequest, S.register_instance, target=t.registration),
    _meta("getInstanceInfo", m.GetInstanceInfoRequest, S.get_instance_info, action=A.META_READ),
    # getCacheLocation is the engine's read path and refreshes recency: not a read-only call.
    _meta("getCacheLocation", m.GetCacheLocationRequest, S.get_cache_location),
    _meta("getCacheMeta", m.GetCacheMetaRequest, S.get_cache_meta, action=A.META_READ),
    _meta("getCacheMetaDetail", m.GetCacheMetaDetailRequest, S.get_cache_meta_detail, action=A.META_READ),
    _meta("startWriteCache", m.StartWriteCacheRequest, S.start_write_cache),
    _meta("finishWriteCache", m.FinishWriteCacheRequest, S.finish_write_cache),
    _meta("removeCache", m.RemoveCacheRequest, S.remove_cache),
    _meta("trimCache", m.TrimCacheRequest, S.trim_cache),
    # UPSTREAM_V2 additions (docs/api-v2.md).
    _meta("getCacheLocationLen", m.GetCacheLocationLenRequest, S.get_cache_location_len),
    _meta("getClusterInfo", m.GetClusterInfoRequest, S.get_cluster_info, action=A.META_READ),
    _meta("reportEvent", m.ReportEventRequest, S.report_event),
    _meta("getHostCacheState", m.GetHostCacheStateRequest, S.get_host_cache_state, action=A.META_READ),
    _meta("getCacheLocationsByBackend", m.GetCacheLocationsByBackendRequest, S.get_cache_locations_by_backend),
]

blueprint = api_blueprint(__name__, OPERATIONS)
