"""The composition root: builds clients, stores, services, handlers and jobs lazily, once
per container, each with the few collaborators it uses.

Only app.py's functions and the routes reach for the runtime (``get_runtime()``); nothing
they call receives it. Tests and the local stack build their own ``Runtime`` (pointing at
their Valkey, moto endpoint and clock) and install it with ``set_runtime``. The app's own
modules are imported at the top (the routes load them all anyway); the AWS SDK is imported
when the first client is made, and only botocore: boto3 (with s3transfer) is imported only
for the optimizer's file transfers (``s3_transfers``). docs/cold-start.md has the figures.

Under Lambda SnapStart the container is restored from a snapshot taken after ``import
app``: ``after_restore`` (registered with the runtime's restore hook when there is one)
drops every connection and the container's identity, so a restored container never
shares a socket, a node id or a random sequence with its snapshot's other copies.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import random
import threading
from collections.abc import Callable
from functools import cached_property
from typing import TYPE_CHECKING, Any

from . import coldstart
from .auth import Authorizer
from .cache.backend_locations import BackendLocations
from .cache.contexts import ContextProvider
from .cache.deletion import Deleter, DeletionService, InlineDeleter, QueuedDeleter
from .cache.event_reports import EventReports
from .cache.purge import PurgeService
from .cache.service import CacheService
from .capacity.eviction import WritePathEviction
from .capacity.gc import CacheGarbageCollector
from .capacity.reclaimer import ControlDirectory, Reclaimer, ReclaimJob
from .capacity.usage import UsageReports
from .clock import Clock, SystemClock
from .control import ConfigCache, ControlPlane
from .control.audit import AuditLog
from .index import BlockIndex
from .index.migration import MigrationIndex
from .observability.emf import EmfWriter
from .observability.events import EventLog, EventRecorder
from .observability.hit_feed import HitFeed, threshold_of
from .observability.logging import apply_level, logger
from .observability.metrics import MetricsPublisher, MetricsRegistry
from .services.admin import AccountAdmin, GroupAdmin, ServiceAdmin, StorageAdmin
from .services.cluster import ClusterInfo
from .services.debug import DebugService
from .services.meta import MetaService
from .services.migrations import MigrationAdmin
from .settings import Settings
from .storage import StorageRegistry
from .storage.health_store import StorageHealthStore
from .storage.objects import open_store
from .stores.faults import FaultRegistry
from .stores.gc_state import GcStateStore
from .stores.lease import Lease
from .stores.metrics import MetricsStore
from .stores.reporters import ReporterStore
from .valkey import Valkey, connect, memory_bytes
from .workflows.deletes import StepFunctionsDeleter
from .workflows.demotion import TierDemotions
from .workflows.event_report import ReporterLiveness
from .workflows.executions import StateMachine
from .workflows.health import HealthChecks, StorageProber, StorageReprobe
from .workflows.hit_curves import HitCurves, HitCurveStore, LiveCurves
from .workflows.migrations import COPY_EXECUTION_PREFIX, CopyTasks, TierCopies
from .workflows.purges import PurgeExecutions, purge_input
from .workflows.reaper import SessionReaper
from .workflows.sweeps import CapacityReports
from .workflows.tuning import InstanceTuningJob, instance_tuning
from .workflows.usage_metrics import UsageMetrics

if TYPE_CHECKING:
    import botocore.session


class Runtime:
    """Lazily built clients and services for one container."""

    def __init__(
        self,
        settings: Settings | None = None,
        clock: Clock | None = None,
        valkey: Valkey | None = None,
        aws_clients: dict[str, Any] | None = None,
    ) -> None:
        self.settings = settings or Settings.from_env()
        self.clock = clock or SystemClock()
        self._valkey = valkey
        self._aws_clients: dict[str, Any] = dict(aws_clients or {})
        self._aws_session: botocore.session.Session | None = None
        self._lock = threading.Lock()

    def reconfigure(self, **changes: Any) -> None:
        """New settings for everything built from now on: the services built so far are
        dropped (to be rebuilt on next use), the Valkey and AWS clients kept. For tests and
        the local stack; a deployed container's settings never change."""
        self.settings = dataclasses.replace(self.settings, **changes)
        self._drop_services()

    def after_restore(self) -> None:
        """Make this container its own after a SnapStart restore: the Valkey pool and the
        AWS clients are dropped (their sockets belong to the snapshot; the next use connects
        again), and with them every service holding them; a node id the environment did not
        fix is drawn again (it names the lease holder)."""
        with self._lock:
            valkey, self._valkey = self._valkey, None
            self._aws_clients.clear()
            self._aws_session = None
        if valkey is not None:
            valkey.close()
        if "KVCM_NODE_ID" not in os.environ:
            self.settings = dataclasses.replace(self.settings, node_id=Settings().node_id)
        self._drop_services()

    def _drop_services(self) -> None:
        for name, value in list(vars(type(self)).items()):
            if isinstance(value, cached_property):
                self.__dict__.pop(name, None)

    # ------------------------------------------------------------ clients

    @property
    def valkey(self) -> Valkey:
        """The redis-py client (one connection pool per container)."""
        if self._valkey is None:
            credentials = self._valkey_credentials()  # outside the lock: it takes it for an AWS client
            with self._lock:
                if self._valkey is None:
                    self._valkey = connect(
                        self.settings.valkey_url,
                        cluster=self.settings.valkey_cluster,
                        connect_timeout_s=self.settings.valkey_connect_timeout_s,
                        socket_timeout_s=self.settings.valkey_socket_timeout_s,
                        **credentials,
                    )
        return self._valkey

    def _valkey_credentials(self) -> dict[str, str]:
        """``username``/``password`` for Valkey AUTH: the secret's when one is configured,
        else the settings' (a URL ``rediss://user:password@host`` works too)."""
        username, password = self.settings.valkey_username, self.settings.valkey_password
        if self.settings.valkey_secret_arn:
            secret = json.loads(
                self.aws("secretsmanager").get_secret_value(SecretId=self.settings.valkey_secret_arn)["SecretString"]
            )
            username, password = secret.get("username", username), secret["password"]
        return {key: value for key, value in (("username", username), ("password", password)) if value}

    def aws(self, service: str) -> Any:
        """A botocore client (endpoint from ``AWS_ENDPOINT_URL`` when set, e.g. the moto
        server), one per service and container."""
        client = self._aws_clients.get(service)
        if client is None:
            with self._lock:
                client = self._aws_clients.get(service)
                if client is None:
                    # botocore's modules, the session and the service model last as long as the container.
                    with coldstart.paused():
                        client = self._botocore().create_client(
                            service, region_name=self.settings.aws_region, config=_client_config()
                        )
                    self._aws_clients[service] = client
        return client

    def s3_transfers(self) -> Any:
        """An S3 client with boto3's managed transfers (``upload_file``, ``download_file``),
        for the optimizer's tasks; one per container, over the container's session (boto3
        registers its class hooks on the session: a second boto3 session over it would
        inject them twice)."""
        client = self._aws_clients.get(_S3_TRANSFERS)
        if client is None:
            import boto3

            with self._lock:
                client = self._aws_clients.get(_S3_TRANSFERS)
                if client is None:
                    client = boto3.Session(botocore_session=self._botocore()).client(
                        "s3", region_name=self.settings.aws_region
                    )
                    self._aws_clients[_S3_TRANSFERS] = client
        return client

    def _botocore(self) -> botocore.session.Session:
        """The container's botocore session (credentials resolved once); the caller holds ``_lock``."""
        if self._aws_session is None:
            import botocore.session

            session = botocore.session.get_session()
            # The service models are read once per process, not once per session (tests and
            # the local stack build many runtimes; botocore's JSON decoding dominated them).
            session.register_component("data_loader", _shared_data_loader())
            self._aws_session = session
        return self._aws_session

    # ------------------------------------------------------------ stores and the index

    @cached_property
    def control(self) -> ControlPlane:
        """DynamoDB control plane: storages, groups, instances, accounts."""
        return ControlPlane(
            dynamodb=lambda: self.aws("dynamodb"), table_name=self.settings.control_table, clock=self.clock
        )

    @cached_property
    def config(self) -> ConfigCache:
        """Per-container, version-refreshed cache of the control plane for the hot path."""
        return ConfigCache(
            self.control, clock=self.clock, refresh_s=self.settings.config_refresh_s, on_log_level=apply_level
        )

    @cached_property
    def audit(self) -> AuditLog:
        """The audit log: admin mutations and denied calls, in the control table."""
        return AuditLog(self.control.table, self.clock, ttl_days=self.settings.audit_ttl_days)

    @cached_property
    def index(self) -> BlockIndex:
        """The block index in Valkey."""
        return BlockIndex(self.valkey, prefix=self.settings.key_prefix, clock=self.clock)

    @cached_property
    def storages(self) -> StorageRegistry:
        """Data storage backends by config."""
        return StorageRegistry(
            valkey_factory=lambda: self.valkey,
            s3_client_factory=lambda: self.aws("s3"),
            key_prefix=self.settings.key_prefix,
            min_free_bytes=self.settings.storage_min_free_bytes,
        )

    @cached_property
    def reporters(self) -> ReporterStore:
        """Engine-reported locations and reporter state in Valkey (reportEvent)."""
        return ReporterStore(self.valkey, prefix=self.settings.key_prefix)

    @cached_property
    def faults(self) -> FaultRegistry:
        """Debug-service fault injection."""
        return FaultRegistry(self.valkey, prefix=self.settings.key_prefix)

    @cached_property
    def health(self) -> StorageHealthStore:
        """Storage health shared by every container."""
        return StorageHealthStore(self.valkey, prefix=self.settings.key_prefix, clock=self.clock)

    @cached_property
    def lease(self) -> Lease:
        """The background-job lease ("leader" in upstream's words)."""
        return Lease(
            self.valkey,
            prefix=self.settings.key_prefix,
            node_id=self.settings.node_id,
            ttl_ms=self.settings.lease_ttl_ms,
            clock=self.clock,
        )

    @cached_property
    def metrics_store(self) -> MetricsStore:
        """Every container's metrics, added up in Valkey."""
        return MetricsStore(self.valkey, self.settings.key_prefix)

    # ------------------------------------------------------------ observability

    @cached_property
    def metrics(self) -> MetricsRegistry:
        """This container's metrics registry (published to ``metrics_store``)."""
        return MetricsRegistry()

    @cached_property
    def metrics_publisher(self) -> MetricsPublisher:
        """Publishes ``metrics`` to ``metrics_store``: ``publish(force=False)`` on the
        request path (at most once a second), ``publish()`` when a job or getMetrics needs
        everything out."""
        return MetricsPublisher(self.metrics, lambda delta: self.metrics_store.add(delta), self.clock)

    @cached_property
    def events(self) -> EventLog:
        """The event log (``KVCM_EVENT_LOG``); partitioned by each instance's group."""
        return EventLog.from_settings(
            self.settings.event_log_path,
            open_objects=lambda target: open_store(target, lambda: self.aws("s3")),
            group_of=lambda instance_id: self.config.instance(instance_id).group,
        )

    @cached_property
    def event_recorder(self) -> EventRecorder:
        """Publishes the meta calls the optimizer replays to ``events``."""
        return EventRecorder(self.events, self.config, self.clock, with_tokens=self.settings.event_log_tokens)

    @cached_property
    def auth(self) -> Authorizer:
        """Authentication (API keys, admin passwords) and roles."""
        return Authorizer(self.config, self.control, self.clock)

    # ------------------------------------------------------------ the cache

    @cached_property
    def contexts(self) -> ContextProvider:
        """instance id → InstanceContext for the hot path."""
        return ContextProvider(
            self.config, self.storages, self.index, self.health, self.clock, refresh_s=self.settings.config_refresh_s
        )

    @cached_property
    def deletion(self) -> DeletionService:
        return DeletionService(self.index)

    def _state_machine(self, arn: str, name_prefix: str) -> StateMachine:
        return StateMachine(lambda: self.aws("stepfunctions"), arn, name_prefix)

    @cached_property
    def deleter(self) -> Deleter:
        """Where deletions go: the batched_delete state machine when one is configured,
        else inline in the calling request."""
        if self.settings.delete_state_machine_arn:
            return StepFunctionsDeleter(lambda: self.aws("stepfunctions"), self.settings.delete_state_machine_arn)
        return InlineDeleter(self.deletion)

    @cached_property
    def purge(self) -> PurgeService:
        """Whole-instance purges (removeInstance, trimCache): inline, then the
        instance_purge state machine when one is configured."""
        machine = self._state_machine(self.settings.purge_state_machine_arn, "purge")
        return PurgeService(
            self.index,
            self.control,
            self.contexts,
            self.deletion,
            self.deleter,
            self.clock,
            start_execution=(lambda job: machine.start(purge_input(job))) if machine.arn else None,
            reported=self.reporters,
            feeds=self.hit_curve_store,
        )

    @cached_property
    def tier_copies(self) -> TierCopies:
        """Starts tiered Copies (the tier_copy state machine)."""
        return TierCopies(self._state_machine(self.settings.copy_state_machine_arn, COPY_EXECUTION_PREFIX))

    @cached_property
    def tier_demotions(self) -> TierDemotions:
        """Reclaim's demotes (``demote_on_reclaim``): begun in the round, copied by tier_copy."""
        return TierDemotions(
            self.index, MigrationIndex(self.index), self.tier_copies, self.deleter, self.clock, self.metrics
        )

    @cached_property
    def copy_tasks(self) -> CopyTasks:
        """The tier_copy state machine's tasks."""
        return CopyTasks(self.contexts, self.index, MigrationIndex(self.index), self.deleter, self.clock, self.metrics)

    @cached_property
    def cache(self) -> CacheService:
        """The meta data plane."""
        return CacheService(
            self.index,
            self.contexts,
            self.deleter,
            self.purge,
            self.clock,
            self.settings,
            self.metrics,
            on_capacity_refused=self.reclaim_job.wake,
            make_room=WritePathEviction(self.index, QueuedDeleter(self.index), self.clock, self.events, self.metrics),
            reported=self.event_reports.visible_if_configured,
            hit_feed=self.hit_feed,
        )

    @cached_property
    def hit_feed(self) -> HitFeed:
        rate = self.settings.hit_feed_rate
        return HitFeed(threshold_of(rate) if rate > 0 else 0, self.settings.hit_feed_max_len, self.clock)

    @cached_property
    def event_reports(self) -> EventReports:
        return EventReports(self.config, self.reporters, self.metrics, self.clock)

    @cached_property
    def cluster(self) -> ClusterInfo:
        return ClusterInfo(self.lease, self.settings.advertised_endpoint, self.clock)

    # ------------------------------------------------------------ API handlers

    @cached_property
    def meta_service(self) -> MetaService:
        return MetaService(
            self.control,
            self.config,
            self.contexts,
            self.cache,
            self.event_reports,
            BackendLocations(self.config, self.cache, self.event_reports, self.settings.max_keys_per_request),
            self.cluster,
            reprobe=self.storage_reprobe,
        )

    @cached_property
    def usage_reports(self) -> UsageReports:
        return UsageReports(self.control, self.contexts, self.index)

    @cached_property
    def storage_admin(self) -> StorageAdmin:
        return StorageAdmin(self.control, self.storages)

    @cached_property
    def group_admin(self) -> GroupAdmin:
        return GroupAdmin(
            self.control,
            self.index,
            self.purge,
            self.usage_reports,
            CapacityReports(
                lambda: self.aws("stepfunctions"), lambda: self.aws("s3"), self.settings.sweep_state_machine_arn
            ),
            self.metrics,
            self.metrics_store,
            self.hit_curve_store,
        )

    @cached_property
    def hit_curve_store(self) -> HitCurveStore:
        return HitCurveStore(self.valkey, self.index.prefix)

    @cached_property
    def hit_curves(self) -> HitCurves:
        return HitCurves(
            self.lease,
            self.control,
            self.hit_curve_store,
            self.hit_feed,
            self.metrics,
            self.clock,
            self.settings.hit_curve_s_max,
        )

    @cached_property
    def migration_admin(self) -> MigrationAdmin:
        return MigrationAdmin(
            self.config,
            self.contexts,
            self.index,
            self.tier_copies,
            MigrationIndex(self.index),
            self.clock,
            self.metrics,
        )

    @cached_property
    def account_admin(self) -> AccountAdmin:
        return AccountAdmin(
            self.control,
            lambda: self.audit,
            self.clock,
            self.settings.api_key_default_ttl_s,
            self.settings.api_key_max_ttl_s,
        )

    @cached_property
    def service_admin(self) -> ServiceAdmin:
        return ServiceAdmin(
            self.control,
            lambda: self.valkey.ping(),
            self.lease,
            self.cluster,
            self.metrics_publisher,
            self.metrics_store,
            self.clock,
            self.health,
        )

    @cached_property
    def debug_service(self) -> DebugService:
        return DebugService(
            lambda: self.faults,
            enabled=self.settings.debug_service,
            auth_enabled=self.settings.auth_enabled,
            stage=self.settings.stage,
        )

    def service[S](self, owner: type[S]) -> S:
        """The container's instance of a handler class (``routes.dispatch``)."""
        instance: S = getattr(self, _HANDLERS[owner])
        return instance

    # ------------------------------------------------------------ jobs (app.py's task functions and schedules)

    @cached_property
    def reclaim_job(self) -> ReclaimJob:
        """Reclaim rounds and the write path's wake-ups, with this process's state."""
        reclaimer = Reclaimer(
            self.index,
            ControlDirectory(self.control, self.clock),
            self.contexts,
            self.deleter,
            self.clock,
            events=self.events,
            metrics=self.metrics,
            # Tier triggers start Copies, and reclaim demotes, only where the tier_copy state
            # machine is deployed.
            copies=self.tier_copies if self.settings.copy_state_machine_arn else None,
            demoter=self.tier_demotions if self.settings.copy_state_machine_arn else None,
        )
        return ReclaimJob(reclaimer, self.index, self.clock, self.lease)

    @cached_property
    def cache_gc(self) -> CacheGarbageCollector:
        """The background GC: orphan WRITING locations and those whose data is gone."""
        return CacheGarbageCollector(
            self.lease,
            self.control,
            self.index,
            self.contexts,
            self.deleter,
            GcStateStore(self.valkey, self.settings.key_prefix),
            self.clock,
            self.metrics,
            orphan_grace_s=self.settings.cache_gc_orphan_grace_s,
            round_pause_s=self.settings.cache_gc_round_pause_s,
            longest_session_s=self.settings.max_write_timeout_s,
            enabled=self.settings.cache_gc,
        )

    @cached_property
    def emf(self) -> EmfWriter:
        """The CloudWatch metrics the template's alarms watch (none without a namespace)."""
        return EmfWriter(self.settings.metrics_namespace, self.clock)

    @cached_property
    def session_reaper(self) -> SessionReaper:
        return SessionReaper(
            self.lease,
            self.control,
            self.index,
            self.contexts,
            self.cache,
            self.clock,
            self._state_machine(self.settings.reaper_state_machine_arn, "reaper"),
            self.metrics,
            self.emf,
        )

    @cached_property
    def purge_executions(self) -> PurgeExecutions:
        return PurgeExecutions(self.purge, self._state_machine(self.settings.purge_state_machine_arn, "purge"))

    @cached_property
    def storage_prober(self) -> StorageProber:
        """Probes storages into ``health``; a change drops this container's cached contexts."""
        return StorageProber(self.health, self.metrics, self.clock, on_change=self.contexts.expire)

    @cached_property
    def health_checks(self) -> HealthChecks:
        return HealthChecks(self.lease, self.control, self.storages, self.health, self.storage_prober)

    @cached_property
    def storage_reprobe(self) -> StorageReprobe:
        """Called by reads and writes refused for want of a storage."""
        return StorageReprobe(
            lambda instance_id: [s.backend for s in self.contexts(instance_id).storages],
            self.health,
            self.storage_prober,
        )

    @cached_property
    def usage_metrics(self) -> UsageMetrics:
        return UsageMetrics(self.lease, self.usage_reports, self.metrics, lambda: memory_bytes(self.valkey))

    @cached_property
    def reporter_liveness(self) -> ReporterLiveness:
        return ReporterLiveness(self.lease, self.config, self.event_reports, self.reporters, self.clock)

    @cached_property
    def instance_tuning(self) -> InstanceTuningJob:
        """Per-instance quota tuning from the event log (``KVCM_EVENT_LOG``: S3 or a directory)."""
        return instance_tuning(
            self.control,
            self.settings.event_log_path,
            lambda: self.aws("s3"),
            self.clock,
            LiveCurves(self.hit_curve_store),
        )


def _client_config() -> Any:
    """The runtime's botocore client settings: bounded retries and timeouts."""
    from botocore.config import Config

    return Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=2, read_timeout=10)


#: ``_aws_clients`` entry of the S3 client with boto3's transfer methods.
_S3_TRANSFERS = "s3+transfers"


@functools.cache
def _shared_data_loader() -> Any:
    """The loader of botocore's service models (``aws_models``: what a cold container's
    first client reads), with its cache, shared by every session."""
    from .aws_models import ModelLoader

    return ModelLoader()


#: Handler class → the Runtime property building its instance.
_HANDLERS: dict[type, str] = {
    MetaService: "meta_service",
    StorageAdmin: "storage_admin",
    GroupAdmin: "group_admin",
    MigrationAdmin: "migration_admin",
    AccountAdmin: "account_admin",
    ServiceAdmin: "service_admin",
    DebugService: "debug_service",
}
_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def get_runtime() -> Runtime:
    """The container's runtime, built from the environment on first use."""
    global _runtime
    if _runtime is None:
        with _runtime_lock:
            if _runtime is None:
                _runtime = Runtime()
    return _runtime


def job[T](handler: Callable[..., T]) -> Callable[..., T]:
    """A scheduled or state-machine task function with its container's duties around the
    work: the service's shared settings applied first (the log level ``updateLogger``
    stored), this container's metrics published and its buffered events written last.
    None of them can fail the job. Every run counts: ``job.failure_count{job}`` when it
    raises (a deletion or purge step the state machine retries, a failed round), else
    ``job.last_success_time_s{job}`` (Unix seconds: its age is what to alert on); in
    CloudWatch, ``JobFailures`` or ``JobSuccesses`` by ``Job`` (the template's alarms)."""
    tags = {"job": handler.__name__}

    @functools.wraps(handler)
    def run(*args: Any) -> T:
        runtime = get_runtime()
        try:
            runtime.config.sync()
        except Exception as exc:  # noqa: BLE001 - the job runs on the settings it has
            logger.warning("shared settings not refreshed: %s", exc)
        try:
            result = handler(*args)
        except BaseException:
            runtime.metrics.incr("job.failure_count", 1, tags)
            runtime.emf.emit({"Job": tags["job"]}, {"JobFailures": 1})
            raise
        else:
            runtime.metrics.gauge("job.last_success_time_s", runtime.clock.now(), tags)
            runtime.emf.emit({"Job": tags["job"]}, {"JobSuccesses": 1})
            return result
        finally:
            runtime.metrics_publisher.publish()
            runtime.events.flush()

    return run


def set_runtime(runtime: Runtime | None) -> None:
    """Install ``runtime`` for this process (tests, the local stack); None resets."""
    global _runtime
    with _runtime_lock:
        _runtime = runtime


#: The AWS services the runtime makes clients of.
AWS_SERVICES = ("dynamodb", "s3", "stepfunctions", "secretsmanager")


def before_snapshot() -> None:
    """SnapStart's snapshot hook, run once when Lambda publishes a version: what a first
    request would otherwise build, and that holds no connection, credential or identity,
    goes into the snapshot. Every wire model's validator and serializer; botocore's
    modules and, in the shared loader, the service models, endpoint rule sets and
    partitions of the runtime's clients (a client made with placeholder credentials and
    dropped: the container's own session and clients are made after the restore)."""
    import botocore.session

    from .protocol.wire import build_models

    with coldstart.paused():
        build_models()
        session = botocore.session.get_session()
        session.register_component("data_loader", _shared_data_loader())
        for service in AWS_SERVICES:
            session.create_client(
                service,
                region_name=Settings().aws_region,
                aws_access_key_id="snapshot",
                aws_secret_access_key="snapshot",
                config=_client_config(),
            )


def after_restore() -> None:
    """SnapStart's restore hook: the random sequence is drawn anew (containers restored from
    one snapshot would share it: the same backoff jitter, the same samples), and the
    snapshot's runtime, when init built one, becomes this container's (``Runtime.after_restore``)."""
    random.seed()
    runtime = _runtime
    if runtime is not None:
        runtime.after_restore()


try:  # Lambda's Python runtimes with SnapStart provide the hook registry; elsewhere there is no restore.
    from snapshot_restore_py import (  # type: ignore[import-untyped]
        register_after_restore,
        register_before_snapshot,
    )
except ImportError:
    pass
else:
    register_before_snapshot(before_snapshot)
    register_after_restore(after_restore)

# The app's modules are imported (above): the collector paused since app.py's first import resumes.
coldstart.resume()
