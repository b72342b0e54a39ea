"""MetaService methods (registerInstance, getInstanceInfo, getCacheMeta and removeCache
are AdminService methods too; they are served once, here)."""
from __future__ import annotations

from ..auth import Action as A
from ..auth import targets as t
from ..cache import api, backend_locations, events_api, location_len
from ..control import cluster
from ..observability.events import record_event
from ..protocol import models as m
from .api import api_blueprint
from .dispatch import Operation


def _meta(name: str, request_model, handler, action: A = A.META_WRITE, target=t.instance) -> Operation:
    return Operation(name, request_model, handler, service="meta", action=action, target=target,
                     observer=record_event)


OPERATIONS: list[Operation] = [
    _meta("registerInstance", m.RegisterInstanceRequest, api.register_instance, target=t.registration),
    _meta("getInstanceInfo", m.GetInstanceInfoRequest, api.get_instance_info, action=A.META_READ),
    # getCacheLocation is the engine's read path and refreshes recency: not a read-only call.
    _meta("getCacheLocation", m.GetCacheLocationRequest, api.get_cache_location),
    _meta("getCacheMeta", m.GetCacheMetaRequest, api.get_cache_meta, action=A.META_READ),
    _meta("startWriteCache", m.StartWriteCacheRequest, api.start_write_cache),
    _meta("finishWriteCache", m.FinishWriteCacheRequest, api.finish_write_cache),
    _meta("removeCache", m.RemoveCacheRequest, api.remove_cache),
    _meta("trimCache", m.TrimCacheRequest, api.trim_cache),
    # UPSTREAM_V2 additions (docs/api-v2.md).
    _meta("getCacheLocationLen", m.GetCacheLocationLenRequest, location_len.get_cache_location_len),
    _meta("getClusterInfo", m.GetClusterInfoRequest, cluster.get_cluster_info, action=A.META_READ),
    _meta("reportEvent", m.ReportEventRequest, events_api.report_event),
    _meta("getHostCacheState", m.GetHostCacheStateRequest, events_api.get_host_cache_state, action=A.META_READ),
    _meta("getCacheLocationsByBackend", m.GetCacheLocationsByBackendRequest,
          backend_locations.get_cache_locations_by_backend),
]

blueprint = api_blueprint(__name__, OPERATIONS)
