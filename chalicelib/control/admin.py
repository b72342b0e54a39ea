"""AdminService handlers: ``handler(runtime, request) -> Response``.

``routes/admin.py`` declares them as operations; errors are raised (typed) and become
wire codes in the dispatcher. registerInstance, getInstanceInfo, getCacheMeta and
removeCache are served by the meta blueprint only.
"""
from __future__ import annotations

from typing import Callable, TypeVar

from ..clock import now_ms, now_us
from ..observability.logging import logger, set_level
from ..observability.metrics import COUNTER, MetricsDelta
from ..protocol.errors import InvalidArgumentError, NotLeaderError, ServiceNotReadyError
from ..protocol.models import (AddAccountRequest, CheckHealthResponse, CreateInstanceGroupRequest,
                               DeleteAccountRequest, GetInstanceGroupResponse, GetManagerClusterInfoResponse,
                               GetMetricsResponse, InstanceGroupNameRequest, LeaderElectorConfigResponse,
                               ListAccountResponse, ListInstanceGroupResponse, ListInstanceInfoRequest,
                               ListInstanceInfoResponse, ListRequest, ListStorageResponse, MetricsData, MetricsTag,
                               MetricValue, Response, StorageConfig, StorageNameRequest,
                               StorageRequest, UpdateInstanceGroupRequest, UpdateLeaderElectorConfigRequest,
                               UpdateLoggerRequest, UpdateStorageRequest)
from ..protocol.models import (ApiKeyInfo, CreateApiKeyRequest, CreateApiKeyResponse, ListApiKeyRequest,
                               ListApiKeyResponse, ListAuditLogRequest, ListAuditLogResponse, RevokeApiKeyRequest)
from ..runtime import Runtime
from .api_keys import ApiKeyRecord
from .cluster import admin_endpoint
from .errors import UnknownEntityError
from .validation import require, require_name, validate_storage_config

# ------------------------------------------------------------------ storages


def _checked_storage(runtime: Runtime, config: StorageConfig | None) -> StorageConfig:
    """Generic checks first (their messages name ``storage.*``), then the backend's own."""
    config = validate_storage_config(config)
    runtime.storages.validate(config)
    return config


def add_storage(runtime: Runtime, request: StorageRequest) -> Response:
    runtime.control.add_storage(_checked_storage(runtime, request.storage))
    return Response()


def update_storage(runtime: Runtime, request: UpdateStorageRequest) -> Response:
    runtime.control.update_storage(_checked_storage(runtime, request.storage), force=request.force_update)
    return Response()


def enable_storage(runtime: Runtime, request: StorageNameRequest) -> Response:
    runtime.control.set_storage_available(request.storage_unique_name, True)
    return Response()


def disable_storage(runtime: Runtime, request: StorageNameRequest) -> Response:
    runtime.control.set_storage_available(request.storage_unique_name, False)
    return Response()


def remove_storage(runtime: Runtime, request: StorageNameRequest) -> Response:
    runtime.control.remove_storage(request.storage_unique_name)
    return Response()


def list_storage(runtime: Runtime, request: ListRequest) -> ListStorageResponse:
    return ListStorageResponse(storage=[record.config for record in runtime.control.list_storages()])


# ------------------------------------------------------------------ instance groups


def create_instance_group(runtime: Runtime, request: CreateInstanceGroupRequest) -> Response:
    runtime.control.create_group(request.instance_group)
    return Response()


def update_instance_group(runtime: Runtime, request: UpdateInstanceGroupRequest) -> Response:
    runtime.control.update_group(request.instance_group, request.current_version)
    return Response()


def remove_instance_group(runtime: Runtime, request: InstanceGroupNameRequest) -> Response:
    """Remove an empty group, then its usage counters (a group of that name created again
    starts from zero)."""
    runtime.control.remove_group(request.name)
    runtime.index.forget_group(request.name)
    return Response()


def get_instance_group(runtime: Runtime, request: InstanceGroupNameRequest) -> GetInstanceGroupResponse:
    return GetInstanceGroupResponse(instance_group=runtime.control.get_group(require_name(request.name, "name")))


def list_instance_group(runtime: Runtime, request: ListRequest) -> ListInstanceGroupResponse:
    return ListInstanceGroupResponse(instance_group=runtime.control.list_groups())


# ------------------------------------------------------------------ instances


def list_instance_info(runtime: Runtime, request: ListInstanceInfoRequest) -> ListInstanceInfoResponse:
    """The instances of ``instance_group_name``, or all; a group that does not exist has
    none (upstream answers OK with an empty list, and its admin cases rely on it)."""
    control = runtime.control
    name = request.instance_group_name
    if name:
        try:
            groups = {name: control.get_group(name)}
        except UnknownEntityError:
            return ListInstanceInfoResponse()
    else:
        groups = {g.name: g for g in control.list_groups()}
    return ListInstanceInfoResponse(instance_info=[
        record.to_instance_info(groups[record.group].global_quota_group_name if record.group in groups else "")
        for record in control.list_instances(name)])


# ------------------------------------------------------------------ accounts


def add_account(runtime: Runtime, request: AddAccountRequest) -> Response:
    runtime.control.add_account(request.user_name, request.password, request.role, request.instance_groups,
                                request.instance_id_prefixes)
    return Response()


def delete_account(runtime: Runtime, request: DeleteAccountRequest) -> Response:
    runtime.control.delete_account(request.user_name)
    return Response()


def list_account(runtime: Runtime, request: ListRequest) -> ListAccountResponse:
    return ListAccountResponse(accounts=runtime.control.list_accounts())


def _key_info(record: ApiKeyRecord) -> ApiKeyInfo:
    return ApiKeyInfo(key_id=record.key_id, user_name=record.user_name, created_time=record.created_us,
                      expire_time=record.expires_us)


def create_api_key(runtime: Runtime, request: CreateApiKeyRequest) -> CreateApiKeyResponse:
    """A new API key for an account: the key is in this response only."""
    settings = runtime.settings
    ttl_s = request.expire_seconds or settings.api_key_default_ttl_s
    if not 0 < ttl_s <= settings.api_key_max_ttl_s:
        raise InvalidArgumentError(f"field 'expire_seconds' must be in (0, {settings.api_key_max_ttl_s}], "
                                   f"got {request.expire_seconds}")
    api_key, record = runtime.control.create_api_key(request.user_name, ttl_s)
    return CreateApiKeyResponse(api_key=api_key, key_info=_key_info(record))


def revoke_api_key(runtime: Runtime, request: RevokeApiKeyRequest) -> Response:
    runtime.control.revoke_api_key(request.key_id)
    return Response()


def list_api_key(runtime: Runtime, request: ListApiKeyRequest) -> ListApiKeyResponse:
    """Key ids, owners and lifetimes (never a key or its hash)."""
    return ListApiKeyResponse(keys=[_key_info(r) for r in runtime.control.list_api_keys(request.user_name)])


MAX_AUDIT_RECORDS = 1000


def list_audit_log(runtime: Runtime, request: ListAuditLogRequest) -> ListAuditLogResponse:
    """Audit records between ``start_time_ms`` (default: a day ago) and ``end_time_ms``
    (default: now), newest first."""
    # The default end includes the records of this very millisecond.
    end_s = request.end_time_ms / 1000 if request.end_time_ms else runtime.clock.now() + 0.001
    start_s = request.start_time_ms / 1000 if request.start_time_ms else end_s - 86400
    if not 0 <= request.limit <= MAX_AUDIT_RECORDS:
        raise InvalidArgumentError(f"field 'limit' must be in [0, {MAX_AUDIT_RECORDS}], got {request.limit}")
    return ListAuditLogResponse(records=runtime.audit.query(start_s, end_s, request.limit or 100))


# ------------------------------------------------------------------ metrics and health


def service_metrics(runtime: Runtime) -> MetricsDelta:
    """Every container's metrics added up, this one's latest changes included (getMetrics,
    ``GET /metrics``); ServiceNotReadyError when the store cannot be reached."""
    if not runtime.metrics_publisher.publish():
        raise ServiceNotReadyError("metrics store unavailable: this container's latest metrics are not published")
    return runtime.metrics_store.totals()


def get_metrics(runtime: Runtime, request: ListRequest) -> GetMetricsResponse:
    """The service's metrics: counters as ``int_value``, means and gauges as ``float_value``."""
    metrics = [
        MetricsData(
            metric_name=point.name,
            metric_value=(MetricValue(int_value=int(point.value)) if point.kind == COUNTER
                          else MetricValue(float_value=float(point.value))),
            metric_tags=[MetricsTag(tag_key=k, tag_value=v) for k, v in point.tags])
        for point in service_metrics(runtime).points()]
    return GetMetricsResponse(timestamp=now_ms(runtime.clock), metrics=metrics)


def _healthy(what: str, probe: Callable[[], object]) -> bool:
    try:
        probe()
        return True
    except Exception:  # noqa: BLE001 - any failure means unhealthy, reported as a value
        logger.warning("health check: %s failed", what, exc_info=True)
        return False


T = TypeVar("T")


def _or_default(read: Callable[[], T], default: T) -> T:
    try:
        return read()
    except Exception:  # noqa: BLE001 - checkHealth reports, it does not fail
        return default


def check_health(runtime: Runtime, request: ListRequest) -> CheckHealthResponse:
    """``is_health``: Valkey answers PING and the control table answers a read."""
    checks = [_healthy("valkey", lambda: runtime.valkey.ping()),
              _healthy("control table", lambda: runtime.control.ping())]
    return CheckHealthResponse(is_health=all(checks),
                               is_leader=_or_default(lambda: runtime.lease.is_held(), False),
                               elector_last_loop_time_ms=_or_default(lambda: runtime.lease.last_loop_time_ms(), 0))


def get_manager_cluster_info(runtime: Runtime, request: ListRequest) -> GetManagerClusterInfoResponse:
    """The lease holder is the "leader"; ``info_updated_time`` is when this was read (µs)."""
    lease = runtime.lease
    status = lease.status()
    return GetManagerClusterInfoResponse(
        self_node_id=lease.node_id,
        leader_node_id=status.holder or "",
        self_leader_expiration_time=status.expires_at_us if status.holder == lease.node_id else 0,
        info_updated_time=now_us(runtime.clock),
        leader_endpoint=admin_endpoint(runtime.settings.advertised_endpoint, status.holder or lease.node_id))


def leader_demote(runtime: Runtime, request: ListRequest) -> Response:
    """Release the lease if this node holds it; otherwise SERVER_NOT_LEADER (as upstream)."""
    lease = runtime.lease
    if not lease.release():
        holder = lease.holder()
        raise NotLeaderError(f"node '{lease.node_id}' does not hold the background-job lease "
                             f"(holder: {repr(holder) if holder else 'none'})")
    return Response()


def get_leader_elector_config(runtime: Runtime, request: ListRequest) -> LeaderElectorConfigResponse:
    return LeaderElectorConfigResponse(campaign_delay_time_ms=runtime.lease.campaign_delay_ms())


def update_leader_elector_config(runtime: Runtime, request: UpdateLeaderElectorConfigRequest) -> Response:
    runtime.lease.set_campaign_delay_ms(request.campaign_delay_time_ms)
    return Response()


def update_logger(runtime: Runtime, request: UpdateLoggerRequest) -> Response:
    """Set the service's log level: here at once, in every other API container within the
    config refresh period, in scheduled and task functions at their next run
    (``module_name`` is accepted; KVCM has one logger)."""
    require(request.log_level, "log_level")
    try:
        set_level(request.log_level)
    except ValueError as exc:
        raise InvalidArgumentError(f"field 'log_level': {exc}") from None
    runtime.control.set_log_level(request.log_level.strip().upper())
    return Response()
