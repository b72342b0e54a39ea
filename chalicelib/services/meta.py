"""MetaService: the engine-facing methods (registerInstance, getInstanceInfo,
getCacheMeta and removeCache are AdminService methods too; they are served once, here)."""

from __future__ import annotations

from collections.abc import Callable

from ..cache.backend_locations import BackendLocations
from ..cache.contexts import ContextProvider
from ..cache.event_reports import EventReports
from ..cache.location_len import get_cache_location_len
from ..cache.service import CacheService
from ..control import ConfigCache, ControlPlane
from ..control.views import storage_configs_json
from ..protocol.errors import CapacityExceededError, InvalidArgumentError, StorageIOError
from ..protocol.models import (
    FinishWriteCacheRequest,
    FinishWriteCacheResponse,
    GetCacheLocationLenRequest,
    GetCacheLocationLenResponse,
    GetCacheLocationRequest,
    GetCacheLocationResponse,
    GetCacheLocationsByBackendRequest,
    GetCacheLocationsByBackendResponse,
    GetCacheMetaDetailRequest,
    GetCacheMetaDetailResponse,
    GetCacheMetaRequest,
    GetCacheMetaResponse,
    GetClusterInfoRequest,
    GetClusterInfoResponse,
    GetHostCacheStateRequest,
    GetHostCacheStateResponse,
    GetInstanceInfoRequest,
    GetInstanceInfoResponse,
    RegisterInstanceRequest,
    RegisterInstanceResponse,
    RemoveCacheRequest,
    ReportEventRequest,
    ReportEventResponse,
    Response,
    StartWriteCacheRequest,
    StartWriteCacheResponse,
    TrimCacheRequest,
)
from .cluster import ClusterInfo


class MetaService:
    """One method per MetaService RPC."""

    def __init__(
        self,
        control: ControlPlane,
        config: ConfigCache,
        contexts: ContextProvider,
        cache: CacheService,
        reports: EventReports,
        backends: BackendLocations,
        cluster: ClusterInfo,
        reprobe: Callable[[str, bool], None] = lambda instance_id, every_storage: None,
    ) -> None:
        """``reprobe(instance_id, every_storage)`` probes an instance's storages out of
        schedule: every one after a storage error, else those out of service."""
        self.control = control
        self.config = config
        self.contexts = contexts
        self.cache = cache
        self.reports = reports
        self.backends = backends
        self.cluster = cluster
        self.reprobe = reprobe

    def register_instance(self, req: RegisterInstanceRequest) -> RegisterInstanceResponse:
        """Register (idempotently) and fix the instance's index layout; returns the group's storages."""
        record = self.control.register_instance(req)
        group = self.config.group(record.group)
        self.contexts.key_space(record, group, registering=True)
        storage_configs = storage_configs_json(self.config.storages_for_group(record.group))
        return RegisterInstanceResponse(storage_configs=storage_configs, extra_info=group.extra_info)

    def get_instance_info(self, req: GetInstanceInfoRequest) -> GetInstanceInfoResponse:
        if not req.instance_id:
            raise InvalidArgumentError("field 'instance_id' is required")
        record = self.config.instance(req.instance_id)
        quota_group = self.config.group(record.group).global_quota_group_name
        return GetInstanceInfoResponse(instance_group=record.group, instance_info=record.to_instance_info(quota_group))

    def get_cache_location(self, req: GetCacheLocationRequest) -> GetCacheLocationResponse:
        """The cached blocks among the request's keys, by query type (prefix, batch, sliding window)."""
        try:
            return self.cache.get_cache_location(req)
        except StorageIOError:
            self.reprobe(req.instance_id, True)
            raise

    def get_cache_meta(self, req: GetCacheMetaRequest) -> GetCacheMetaResponse:
        """Per key, its locations and their statuses (a debugging view of the index)."""
        return self.cache.get_cache_meta(req)

    def get_cache_meta_detail(self, req: GetCacheMetaDetailRequest) -> GetCacheMetaDetailResponse:
        """Per key, its raw metadata: parent, header fields and every copy (upstream's newest line)."""
        return self.cache.get_cache_meta_detail(req)

    def start_write_cache(self, req: StartWriteCacheRequest) -> StartWriteCacheResponse:
        """Where to write the keys with fewer than ``min_replica_count`` (0 or 1: one) locations
        covering their spec group, stale locations pruned (UPSTREAM_V2 §2.6). A start
        refused for want of storage re-probes the storages out of service (a full one may
        have room again)."""
        try:
            return self.cache.start_write_cache(req)
        except StorageIOError:
            self.reprobe(req.instance_id, True)
            raise
        except CapacityExceededError:
            self.reprobe(req.instance_id, False)
            raise

    def finish_write_cache(self, req: FinishWriteCacheRequest) -> FinishWriteCacheResponse:
        """The written blocks start serving; the others are dropped."""
        return self.cache.finish_write_cache(req)

    def remove_cache(self, req: RemoveCacheRequest) -> Response:
        """The keys' locations stop serving and their data is deleted."""
        return self.cache.remove_cache(req)

    def trim_cache(self, req: TrimCacheRequest) -> Response:
        """Remove an instance's blocks by strategy (all, all metadata, older than a time)."""
        return self.cache.trim_cache(req)

    def get_cache_location_len(self, req: GetCacheLocationLenRequest) -> GetCacheLocationLenResponse:
        return get_cache_location_len(self.cache, req)

    def get_cluster_info(self, req: GetClusterInfoRequest) -> GetClusterInfoResponse:
        return self.cluster.get_cluster_info(req)

    def report_event(self, req: ReportEventRequest) -> ReportEventResponse:
        return self.reports.report_event(req)

    def get_host_cache_state(self, req: GetHostCacheStateRequest) -> GetHostCacheStateResponse:
        return self.reports.get_host_cache_state(req)

    def get_cache_locations_by_backend(
        self, req: GetCacheLocationsByBackendRequest
    ) -> GetCacheLocationsByBackendResponse:
        return self.backends.get_cache_locations_by_backend(req)
