"""The composition root: builds clients and services lazily, once per container.

``get_runtime()`` is what handlers use; tests and the local stack build their own
``Runtime`` (pointing at their Valkey, moto endpoint and clock) and install it with
``set_runtime``.
"""
from __future__ import annotations

import functools
import threading
from functools import cached_property
from typing import Any, Callable, Optional, TypeVar

from .clock import Clock, SystemClock
from .settings import Settings

T = TypeVar("T")


class Runtime:
    """Lazily built clients and services for one container."""

    def __init__(self, settings: Optional[Settings] = None, clock: Optional[Clock] = None,
                 valkey: Any = None, aws_clients: Optional[dict[str, Any]] = None) -> None:
        self.settings = settings or Settings.from_env()
        self.clock = clock or SystemClock()
        self._valkey = valkey
        self._aws_clients: dict[str, Any] = dict(aws_clients or {})
        self._lock = threading.Lock()

    # ------------------------------------------------------------ clients

    @property
    def valkey(self):
        """The redis-py client (one connection pool per container)."""
        if self._valkey is None:
            credentials = self._valkey_credentials()  # outside the lock: it takes it for a boto3 client
            with self._lock:
                if self._valkey is None:
                    from .stores.valkey import connect

                    self._valkey = connect(self.settings.valkey_url, cluster=self.settings.valkey_cluster,
                                           connect_timeout_s=self.settings.valkey_connect_timeout_s,
                                           socket_timeout_s=self.settings.valkey_socket_timeout_s, **credentials)
        return self._valkey

    def _valkey_credentials(self) -> dict[str, str]:
        """``username``/``password`` for Valkey AUTH: the secret's when one is configured,
        else the settings' (a URL ``rediss://user:password@host`` works too)."""
        username, password = self.settings.valkey_username, self.settings.valkey_password
        if self.settings.valkey_secret_arn:
            import json

            secret = json.loads(self.aws("secretsmanager").get_secret_value(
                SecretId=self.settings.valkey_secret_arn)["SecretString"])
            username, password = secret.get("username", username), secret["password"]
        return {key: value for key, value in (("username", username), ("password", password)) if value}

    def aws(self, service: str):
        """A boto3 client (endpoint from ``AWS_ENDPOINT_URL`` when set, e.g. the moto server)."""
        client = self._aws_clients.get(service)
        if client is None:
            with self._lock:
                client = self._aws_clients.get(service)
                if client is None:
                    import boto3
                    from botocore.config import Config

                    client = boto3.client(
                        service,
                        region_name=self.settings.aws_region,
                        config=Config(retries={"max_attempts": 3, "mode": "standard"},
                                      connect_timeout=2, read_timeout=10),
                    )
                    self._aws_clients[service] = client
        return client

    # ------------------------------------------------------------ services

    @cached_property
    def metrics(self):
        """This container's metrics registry (published to ``metrics_store``)."""
        from .observability.metrics import MetricsRegistry

        return MetricsRegistry()

    @cached_property
    def metrics_store(self):
        """Every container's metrics, added up in Valkey."""
        from .stores.metrics import MetricsStore

        return MetricsStore(self.valkey, self.settings.key_prefix)

    @cached_property
    def metrics_publisher(self):
        """Publishes ``metrics`` to ``metrics_store``: ``publish(force=False)`` on the
        request path (at most once a second), ``publish()`` when a job or getMetrics needs
        everything out."""
        from .observability.metrics import MetricsPublisher

        return MetricsPublisher(self.metrics, lambda delta: self.metrics_store.add(delta), self.clock)

    @cached_property
    def control(self):
        """DynamoDB control plane: storages, groups, instances, accounts."""
        from .control import ControlPlane

        return ControlPlane(dynamodb=lambda: self.aws("dynamodb"), table_name=self.settings.control_table,
                            clock=self.clock)

    @cached_property
    def config(self):
        """Per-container, version-refreshed cache of the control plane for the hot path."""
        from .control import ConfigCache
        from .observability.logging import apply_level

        return ConfigCache(self.control, clock=self.clock, refresh_s=self.settings.config_refresh_s,
                           on_log_level=apply_level)

    @cached_property
    def auth(self):
        """Authentication (API keys, admin passwords) and roles."""
        from .auth import Authorizer

        return Authorizer(self.config, self.control, self.clock)

    @cached_property
    def audit(self):
        """The audit log: admin mutations and denied calls, in the control table."""
        from .control.audit import AuditLog

        return AuditLog(self.control.table, self.clock, ttl_days=self.settings.audit_ttl_days)

    @cached_property
    def storages(self):
        """Data storage backends by config."""
        from .storage import StorageRegistry

        return StorageRegistry(valkey_factory=lambda: self.valkey, s3_client_factory=lambda: self.aws("s3"),
                               key_prefix=self.settings.key_prefix)

    @cached_property
    def reporters(self):
        """Engine-reported locations and reporter state in Valkey (reportEvent)."""
        from .stores.reporters import ReporterStore

        return ReporterStore(self.valkey, prefix=self.settings.key_prefix)

    @cached_property
    def index(self):
        """The block index in Valkey."""
        from .index import BlockIndex

        return BlockIndex(self.valkey, prefix=self.settings.key_prefix, clock=self.clock)

    @cached_property
    def contexts(self):
        """instance id → InstanceContext for the hot path."""
        from .cache.contexts import ContextProvider

        return ContextProvider(self.config, self.storages, self.index, self.health, self.clock,
                               refresh_s=self.settings.config_refresh_s)

    @cached_property
    def deletion(self):
        from .cache.deletion import DeletionService

        return DeletionService(self.index)

    @cached_property
    def deleter(self):
        """Where deletions go: the batched_delete state machine when one is configured,
        else inline in the calling request."""
        if self.settings.delete_state_machine_arn:
            from .workflows.deletes import StepFunctionsDeleter

            return StepFunctionsDeleter(lambda: self.aws("stepfunctions"), self.settings.delete_state_machine_arn)
        from .cache.deletion import InlineDeleter

        return InlineDeleter(self.deletion)

    @cached_property
    def cache(self):
        """The meta data plane."""
        from .cache.service import CacheService
        from .cache.deletion import QueuedDeleter
        from .capacity.eviction import WritePathEviction
        from .capacity.reclaimer import request_reclaim

        return CacheService(self.index, self.contexts, self.deleter, self.purge, self.clock, self.settings,
                            self.metrics,
                            on_capacity_refused=lambda group: request_reclaim(self, group),
                            make_room=WritePathEviction(self.index, QueuedDeleter(self.index), self.clock,
                                                        self.events, self.metrics))

    @cached_property
    def purge(self):
        """Whole-instance purges (removeInstance, trimCache): inline, then the
        instance_purge state machine when one is configured."""
        from .cache.purge import PurgeService
        from .workflows.purges import starter

        return PurgeService(self.index, self.control, self.contexts, self.deletion, self.deleter, self.clock,
                            start_execution=starter(self))

    @cached_property
    def faults(self):
        """Debug-service fault injection."""
        from .stores.faults import FaultRegistry

        return FaultRegistry(self.valkey, prefix=self.settings.key_prefix)

    @cached_property
    def events(self):
        from .observability.events import EventLog

        return EventLog.from_settings(self.settings.event_log_path)

    @cached_property
    def health(self):
        """Storage health shared by every container."""
        from .stores.storage_health import HealthStore

        return HealthStore(self.valkey, prefix=self.settings.key_prefix)

    @cached_property
    def lease(self):
        """The background-job lease ("leader" in upstream's words)."""
        from .stores.lease import Lease

        return Lease(self.valkey, prefix=self.settings.key_prefix, node_id=self.settings.node_id,
                     ttl_ms=self.settings.lease_ttl_ms, clock=self.clock)


_runtime: Optional[Runtime] = None
_runtime_lock = threading.Lock()


def get_runtime() -> Runtime:
    """The container's runtime, built from the environment on first use."""
    global _runtime
    if _runtime is None:
        with _runtime_lock:
            if _runtime is None:
                _runtime = Runtime()
    return _runtime


def job(handler: Callable[..., T]) -> Callable[..., T]:
    """A scheduled or state-machine task function with its container's duties around the
    work: the service's shared settings applied first (the log level ``updateLogger``
    stored), this container's metrics published last. Neither can fail the job."""
    @functools.wraps(handler)
    def run(*args: Any) -> T:
        runtime = get_runtime()
        try:
            runtime.config.sync()
        except Exception as exc:  # noqa: BLE001 - the job runs on the settings it has
            from .observability.logging import logger

            logger.warning("shared settings not refreshed: %s", exc)
        try:
            return handler(*args)
        finally:
            runtime.metrics_publisher.publish()

    return run


def set_runtime(runtime: Optional[Runtime]) -> None:
    """Install ``runtime`` for this process (tests, the local stack); None resets."""
    global _runtime
    with _runtime_lock:
        _runtime = runtime
