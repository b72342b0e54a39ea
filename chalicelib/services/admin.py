"""AdminService: storages, instance groups and instances, accounts and keys, and the
service itself (metrics, health, leader, logger). registerInstance, getInstanceInfo,
getCacheMeta and removeCache are served by MetaService only.

Each class below holds the collaborators of one family of methods."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ..cache.purge import PurgeService
from ..capacity.usage import UsageReports, record_usage_gauges
from ..clock import Clock, now_ms
from ..control import ControlPlane
from ..control.api_keys import ApiKeyRecord
from ..control.audit import AuditLog
from ..control.errors import UnknownEntityError
from ..index import BlockIndex
from ..observability.logging import logger, set_level
from ..observability.metrics import COUNTER, MetricsDelta, MetricsPublisher, MetricsRegistry
from ..protocol.errors import InvalidArgumentError, ServiceNotReadyError
from ..protocol.models import (
    AddAccountRequest,
    ApiKeyInfo,
    CheckHealthResponse,
    CreateApiKeyRequest,
    CreateApiKeyResponse,
    CreateInstanceGroupRequest,
    DeleteAccountRequest,
    GetCapacityReportResponse,
    GetGroupHitCurveResponse,
    GetInstanceGroupResponse,
    GetInstanceGroupUsageRequest,
    GetInstanceGroupUsageResponse,
    GetManagerClusterInfoResponse,
    GetMetricsResponse,
    GroupHealthInfo,
    HitCurveInstance,
    HitCurvePoint,
    HitCurveRecommendation,
    InstanceGroupNameRequest,
    LeaderElectorConfigResponse,
    ListAccountResponse,
    ListApiKeyRequest,
    ListApiKeyResponse,
    ListAuditLogRequest,
    ListAuditLogResponse,
    ListInstanceGroupResponse,
    ListInstanceInfoRequest,
    ListInstanceInfoResponse,
    ListRequest,
    ListStorageResponse,
    MetricsData,
    MetricsTag,
    MetricValue,
    RemoveInstanceRequest,
    Response,
    RevokeApiKeyRequest,
    StorageConfig,
    StorageHealthInfo,
    StorageNameRequest,
    StorageRequest,
    UpdateInstanceGroupRequest,
    UpdateLeaderElectorConfigRequest,
    UpdateLoggerRequest,
    UpdateStorageRequest,
)
from ..protocol.validation import require, require_name, validate_storage_config
from ..storage import StorageRegistry
from ..storage.health_store import StorageHealthStore
from ..stores.lease import Lease
from ..stores.metrics import MetricsStore
from ..workflows.hit_curves import HitCurveStore
from ..workflows.sweeps import CapacityReports
from .cluster import ClusterInfo
from .health import NO_WRITABLE_STORAGE, assess

T = TypeVar("T")
#: Audit records one listAuditLog call may ask for.
MAX_AUDIT_RECORDS = 1000


class StorageAdmin:
    """addStorage, updateStorage, enableStorage, disableStorage, removeStorage, listStorage."""

    def __init__(self, control: ControlPlane, storages: StorageRegistry) -> None:
        self.control = control
        self.storages = storages

    def _checked(self, config: StorageConfig | None) -> StorageConfig:
        """Generic checks first (their messages name ``storage.*``), then the backend's own."""
        config = validate_storage_config(config)
        self.storages.validate(config)
        return config

    def add_storage(self, request: StorageRequest) -> Response:
        self.control.add_storage(self._checked(request.storage))
        return Response()

    def update_storage(self, request: UpdateStorageRequest) -> Response:
        self.control.update_storage(self._checked(request.storage), force=request.force_update)
        return Response()

    def enable_storage(self, request: StorageNameRequest) -> Response:
        self.control.set_storage_available(request.storage_unique_name, True)
        return Response()

    def disable_storage(self, request: StorageNameRequest) -> Response:
        self.control.set_storage_available(request.storage_unique_name, False)
        return Response()

    def remove_storage(self, request: StorageNameRequest) -> Response:
        self.control.remove_storage(request.storage_unique_name)
        return Response()

    def list_storage(self, request: ListRequest) -> ListStorageResponse:
        return ListStorageResponse(storage=[record.config for record in self.control.list_storages()])


class GroupAdmin:
    """Instance groups and their instances: configuration, usage, removal, capacity report."""

    def __init__(
        self,
        control: ControlPlane,
        index: BlockIndex,
        purge: PurgeService,
        usage: UsageReports,
        capacity_reports: CapacityReports,
        metrics: MetricsRegistry,
        metrics_store: MetricsStore,
        hit_curves: HitCurveStore,
    ) -> None:
        self.control = control
        self.index = index
        self.purge = purge
        self.usage = usage
        self.capacity_reports = capacity_reports
        self.hit_curves = hit_curves
        self.metrics = metrics
        self.metrics_store = metrics_store

    def create_instance_group(self, request: CreateInstanceGroupRequest) -> Response:
        """Create a group; its usage series exist from now, not from the next usage round."""
        self._refresh_usage_gauges(self.control.create_group(request.instance_group).name)
        return Response()

    def update_instance_group(self, request: UpdateInstanceGroupRequest) -> Response:
        """Update a group; its usage ratio follows a new quota now."""
        self._refresh_usage_gauges(self.control.update_group(request.instance_group, request.current_version).name)
        return Response()

    def _refresh_usage_gauges(self, group: str) -> None:
        """Set a group's usage gauges now, best effort: the change is made, and the next
        usage round sets them if Valkey does not answer here."""
        try:
            reports = self.usage.get_instance_group_usage(GetInstanceGroupUsageRequest(instance_group_name=group))
        except ServiceNotReadyError as exc:
            logger.warning("usage gauges of group %s not set: %s", group, exc)
            return
        for usage in reports.usage:
            record_usage_gauges(self.metrics, usage)

    def _forget_series(self, tag: str, value: str) -> None:
        """Drop every metric series tagged ``tag=value`` (a removed instance or group), best
        effort: the removal has happened, and a series left behind goes with the next one."""
        self.metrics.forget(tag, value)
        try:
            self.metrics_store.forget(tag, value)
        except ServiceNotReadyError as exc:
            logger.warning("metric series of %s=%s not forgotten: %s", tag, value, exc)

    def remove_instance_group(self, request: InstanceGroupNameRequest) -> Response:
        """Remove an empty group, then its usage counters (a group of that name created again
        starts from zero)."""
        self.control.remove_group(request.name)
        self.index.forget_group(request.name)
        self._forget_series("instance_group", request.name)
        return Response()

    def get_instance_group(self, request: InstanceGroupNameRequest) -> GetInstanceGroupResponse:
        return GetInstanceGroupResponse(instance_group=self.control.get_group(require_name(request.name, "name")))

    def list_instance_group(self, request: ListRequest) -> ListInstanceGroupResponse:
        return ListInstanceGroupResponse(instance_group=self.control.list_groups())

    def list_instance_info(self, request: ListInstanceInfoRequest) -> ListInstanceInfoResponse:
        """The instances of ``instance_group_name``, or all; a group that does not exist has
        none (upstream answers OK with an empty list, and its admin cases rely on it)."""
        name = request.instance_group_name
        if name:
            try:
                groups = {name: self.control.get_group(name)}
            except UnknownEntityError:
                return ListInstanceInfoResponse()
        else:
            groups = {g.name: g for g in self.control.list_groups()}
        return ListInstanceInfoResponse(
            instance_info=[
                record.to_instance_info(groups[record.group].global_quota_group_name if record.group in groups else "")
                for record in self.control.list_instances(name)
            ]
        )

    def remove_instance(self, request: RemoveInstanceRequest) -> Response:
        """removeInstance: the instance is unknown from now on; its blocks (data, then
        metadata) and then its record go in a purge that answers within the call for a small
        instance and continues in the ``instance_purge`` state machine for a large one."""
        instance_id = require_name(request.instance_id, "instance_id")
        self.purge.remove_instance(instance_id, request.instance_group)
        self._forget_series("instance_id", instance_id)
        return Response()

    def get_instance_group_usage(self, request: GetInstanceGroupUsageRequest) -> GetInstanceGroupUsageResponse:
        return self.usage.get_instance_group_usage(request)

    def get_capacity_report(self, request: ListRequest) -> GetCapacityReportResponse:
        return self.capacity_reports.get_capacity_report(request)

    def reset_group_hit_curve(self, request: InstanceGroupNameRequest) -> Response:
        """resetGroupHitCurve (upstream's ResetStats, for a group's curve): the curve starts
        over from the traffic after the call; its feed entries not yet read are dropped.
        Until the new curve is confident, ``kvcm.hit_curve.confident`` says 0."""
        group = self.control.get_group(require_name(request.name, "name"))  # unknown: the contract's error
        self.hit_curves.reset(group.name, [r.instance_id for r in self.control.list_instances(group.name)])
        self.metrics.gauge("kvcm.hit_curve.confident", 0.0, {"instance_group": group.name})
        return Response()

    def get_group_hit_curve(self, request: InstanceGroupNameRequest) -> GetGroupHitCurveResponse:
        """The group ``name``'s live curve as the ``hit_curves`` schedule last saved it."""
        if not request.name:
            raise InvalidArgumentError("field 'name' is required")
        group = self.control.get_group(request.name)  # unknown: the contract's error
        view = self.hit_curves.view(group.name)
        if view is None:
            return GetGroupHitCurveResponse(
                instance_group=group.name, quota_bytes=group.quota.capacity if group.quota else 0
            )
        rec = self.hit_curves.recommendation(group.name)
        marks = view["at_quota"]
        return GetGroupHitCurveResponse(
            instance_group=group.name,
            quota_bytes=view["quota_bytes"],
            used_percentage=view["used_percentage"],
            confident=view.get("confident", False),
            min_kept_keys=view.get("min_kept_keys", 0),
            points=[HitCurvePoint(**p) for p in view["points"]],
            hit_ratio_at_quota=marks["x1"],
            hit_ratio_at_half_quota=marks["x0.5"],
            hit_ratio_at_double_quota=marks["x2"],
            instances=[HitCurveInstance(instance_id=n, **i) for n, i in sorted(view["instances"].items())],
            recommendation=HitCurveRecommendation(**rec) if rec else None,
            updated_time_ms=int(view["updated_at"] * 1000),
            through_time_ms=int(view["through_s"] * 1000),
        )


def _key_info(record: ApiKeyRecord) -> ApiKeyInfo:
    return ApiKeyInfo(
        key_id=record.key_id, user_name=record.user_name, created_time=record.created_us, expire_time=record.expires_us
    )


class AccountAdmin:
    """Accounts, API keys and the audit log."""

    def __init__(
        self,
        control: ControlPlane,
        audit: Callable[[], AuditLog],
        clock: Clock,
        api_key_default_ttl_s: int,
        api_key_max_ttl_s: int,
    ) -> None:
        self.control = control
        self.audit = audit
        self.clock = clock
        self.api_key_default_ttl_s = api_key_default_ttl_s
        self.api_key_max_ttl_s = api_key_max_ttl_s

    def add_account(self, request: AddAccountRequest) -> Response:
        self.control.add_account(
            request.user_name, request.password, request.role, request.instance_groups, request.instance_id_prefixes
        )
        return Response()

    def delete_account(self, request: DeleteAccountRequest) -> Response:
        self.control.delete_account(request.user_name)
        return Response()

    def list_account(self, request: ListRequest) -> ListAccountResponse:
        return ListAccountResponse(accounts=self.control.list_accounts())

    def create_api_key(self, request: CreateApiKeyRequest) -> CreateApiKeyResponse:
        """A new API key for an account: the key is in this response only."""
        ttl_s = request.expire_seconds or self.api_key_default_ttl_s
        if not 0 < ttl_s <= self.api_key_max_ttl_s:
            raise InvalidArgumentError(
                f"field 'expire_seconds' must be in (0, {self.api_key_max_ttl_s}], got {request.expire_seconds}"
            )
        api_key, record = self.control.create_api_key(request.user_name, ttl_s)
        return CreateApiKeyResponse(api_key=api_key, key_info=_key_info(record))

    def revoke_api_key(self, request: RevokeApiKeyRequest) -> Response:
        self.control.revoke_api_key(request.key_id)
        return Response()

    def list_api_key(self, request: ListApiKeyRequest) -> ListApiKeyResponse:
        """Key ids, owners and lifetimes (never a key or its hash)."""
        return ListApiKeyResponse(keys=[_key_info(r) for r in self.control.list_api_keys(request.user_name)])

    def list_audit_log(self, request: ListAuditLogRequest) -> ListAuditLogResponse:
        """Audit records between ``start_time_ms`` (default: a day ago) and ``end_time_ms``
        (default: now), newest first."""
        # The default end includes the records of this very millisecond.
        end_s = request.end_time_ms / 1000 if request.end_time_ms else self.clock.now() + 0.001
        start_s = request.start_time_ms / 1000 if request.start_time_ms else end_s - 86400
        if not 0 <= request.limit <= MAX_AUDIT_RECORDS:
            raise InvalidArgumentError(f"field 'limit' must be in [0, {MAX_AUDIT_RECORDS}], got {request.limit}")
        return ListAuditLogResponse(records=self.audit().query(start_s, end_s, request.limit or 100))


def _failure[R](what: str, probe: Callable[[], R]) -> tuple[R | None, str]:
    """(``probe()``, "") or (None, what failed and why); one log line, no traceback: a
    load balancer asks every few seconds."""
    try:
        return probe(), ""
    except Exception as exc:  # noqa: BLE001 - any failure means unhealthy, reported as a value
        problem = f"{what}: {exc or type(exc).__name__}"
        logger.warning("health check: %s", problem)
        return None, problem


def _or_default(read: Callable[[], T], default: T) -> T:
    try:
        return read()
    except Exception:  # noqa: BLE001 - checkHealth reports, it does not fail
        return default


class ServiceAdmin:
    """The service itself: metrics, health, the leader (background-job lease), the log level."""

    def __init__(
        self,
        control: ControlPlane,
        valkey_ping: Callable[[], object],
        lease: Lease,
        cluster: ClusterInfo,
        metrics_publisher: MetricsPublisher,
        metrics_store: MetricsStore,
        clock: Clock,
        health: StorageHealthStore,
    ) -> None:
        self.control = control
        self.valkey_ping = valkey_ping
        self.health = health
        self.lease = lease
        self.cluster = cluster
        self.metrics_publisher = metrics_publisher
        self.metrics_store = metrics_store
        self.clock = clock

    def service_metrics(self) -> MetricsDelta:
        """Every container's metrics added up, this one's latest changes included (getMetrics,
        ``GET /metrics``); ServiceNotReadyError when the store cannot be reached."""
        if not self.metrics_publisher.publish():
            raise ServiceNotReadyError("metrics store unavailable: this container's latest metrics are not published")
        return self.metrics_store.totals()

    def get_metrics(self, request: ListRequest) -> GetMetricsResponse:
        """The service's metrics: counters as ``int_value``, means and gauges as ``float_value``."""
        metrics = [
            MetricsData(
                metric_name=point.name,
                metric_value=(
                    MetricValue(int_value=int(point.value))
                    if point.kind == COUNTER
                    else MetricValue(float_value=float(point.value))
                ),
                metric_tags=[MetricsTag(tag_key=k, tag_value=v) for k, v in point.tags],
            )
            for point in self.service_metrics().points()
        ]
        return GetMetricsResponse(timestamp=now_ms(self.clock), metrics=metrics)

    def check_health(self, request: ListRequest) -> CheckHealthResponse:
        """``is_health``: Valkey answers PING, the control table answers a read, and every
        instance group has a storage to write to; ``problems`` says why not, ``storages``
        and ``degraded_groups`` what the storage health checks found (README "Health")."""
        problems = [
            problem
            for _, problem in (_failure("valkey", self.valkey_ping), _failure("control table", self.control.ping))
            if problem
        ]
        storages: list[StorageHealthInfo] = []
        degraded: list[GroupHealthInfo] = []
        records, problem = _failure("control table", self.control.list_storages)
        groups, _ = _failure("control table", self.control.list_groups)
        states, state_problem = _failure("storage health store", self.health.load)
        if records is not None and groups is not None and states is not None:
            storages, degraded = assess(records, groups, states)
        problems += [
            f"instance group {g.instance_group_name!r} has no storage to write to: {g.reason}"
            for g in degraded
            if g.status == NO_WRITABLE_STORAGE
        ]
        if not problems:  # the first failure of each source is already named
            problems = [p for p in (problem, state_problem) if p]
        return CheckHealthResponse(
            is_health=not problems,
            is_leader=_or_default(self.lease.is_held, False),
            elector_last_loop_time_ms=_or_default(self.lease.last_loop_time_ms, 0),
            problems=problems,
            storages=storages,
            degraded_groups=degraded,
        )

    def get_manager_cluster_info(self, request: ListRequest) -> GetManagerClusterInfoResponse:
        return self.cluster.get_manager_cluster_info()

    def leader_demote(self, request: ListRequest) -> Response:
        """Release the lease if this node holds it; otherwise SERVER_NOT_LEADER (as upstream)."""
        self.cluster.leader_demote()
        return Response()

    def get_leader_elector_config(self, request: ListRequest) -> LeaderElectorConfigResponse:
        return LeaderElectorConfigResponse(campaign_delay_time_ms=self.lease.campaign_delay_ms())

    def update_leader_elector_config(self, request: UpdateLeaderElectorConfigRequest) -> Response:
        self.lease.set_campaign_delay_ms(request.campaign_delay_time_ms)
        return Response()

    def update_logger(self, request: UpdateLoggerRequest) -> Response:
        """Set the service's log level: here at once, in every other API container within the
        config refresh period, in scheduled and task functions at their next run
        (``module_name`` is accepted; KVCM has one logger)."""
        require(request.log_level, "log_level")
        try:
            set_level(request.log_level)
        except ValueError as exc:
            raise InvalidArgumentError(f"field 'log_level': {exc}") from None
        self.control.set_log_level(request.log_level.strip().upper())
        return Response()
