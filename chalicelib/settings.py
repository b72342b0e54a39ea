"""Service configuration, read once from the environment (see README "Configuration")."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return raw.strip().lower() in ("1", "true", "yes", "on")


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw not in (None, "") else default


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw not in (None, "") else default


@dataclass(frozen=True)
class Settings:
    """Everything configurable about one KVCM deployment."""

    stage: str = "local"
    valkey_url: str = "redis://127.0.0.1:6379/0"
    #: Talk to Valkey as a cluster (ElastiCache Serverless, cluster mode enabled).
    valkey_cluster: bool = False
    #: Valkey AUTH user (ElastiCache RBAC); a password from the environment or, deployed,
    #: from a Secrets Manager secret holding ``{"username": ..., "password": ...}``.
    valkey_username: str = ""
    valkey_password: str = ""
    valkey_secret_arn: str = ""
    key_prefix: str = "kvcm"
    control_table: str = "kvcm-control"
    aws_region: str = "us-east-1"
    node_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}")
    debug_service: bool = False
    auth_enabled: bool = False
    default_write_timeout_s: int = 30
    max_write_timeout_s: int = 3600
    #: startWriteCache probes the keys' SERVING locations (StorageBackend.might_exist) and
    #: rewrites those whose data is gone (UPSTREAM_V2 §2.6): one more read and a probe per start.
    prune_stale_on_write: bool = False
    max_keys_per_request: int = 16384
    #: Write sessions one instance may have open; every start opens one, new keys or not.
    max_write_sessions: int = 4096
    #: With auth on, the write sessions one account may have open on one instance: one
    #: caller cannot take the instance's whole budget (0 = no limit of its own).
    max_write_sessions_per_caller: int = 1024
    config_refresh_s: float = 2.0
    #: Instances the seeded ``default`` group takes (its ``max_instance_count``): every
    #: background round costs something per instance.
    default_group_max_instances: int = 128
    lease_ttl_ms: int = 10_000
    event_log_path: str = ""
    #: Event lines carry the request's raw token_ids (prompt content) only when set.
    event_log_tokens: bool = False
    #: Share of block keys in the hit feed the live hit-ratio curves are built from
    #: (observability.hit_feed; 0: off), each instance's stream bound (approximate), and
    #: the keys each instance's curve keeps (optimizer.live).
    hit_feed_rate: float = 1 / 8
    hit_feed_max_len: int = 100_000
    hit_curve_s_max: int = 8192
    #: Valkey socket timeouts on the request path: a hung Valkey fails a call with
    #: SERVICE_NOT_READY after about this long instead of tens of seconds.
    valkey_connect_timeout_s: float = 0.5
    valkey_socket_timeout_s: float = 1.0
    #: Request limits, checked before anything is parsed or echoed.
    max_body_bytes: int = 6 * 1024 * 1024
    max_trace_id_length: int = 256
    #: API key lifetimes (createApiKey's expire_seconds: 0 = default, at most max).
    api_key_default_ttl_s: int = 90 * 86400
    api_key_max_ttl_s: int = 365 * 86400
    #: How long audit records are kept (DynamoDB TTL).
    audit_ttl_days: int = 90
    #: Deploy the API routes behind the API Gateway authorizer (routes.gateway).
    gateway_authorizer: bool = False
    reaper_state_machine_arn: str = ""
    delete_state_machine_arn: str = ""
    sweep_state_machine_arn: str = ""
    purge_state_machine_arn: str = ""
    copy_state_machine_arn: str = ""
    #: ``host:port`` getClusterInfo names as the leader's endpoint (every node serves every
    #: method, so it is the API's own); empty: no endpoint, clients keep the URL they use.
    advertised_endpoint: str = ""
    #: Background GC (docs/capacity-and-removal.md, "Background GC"): on or off; how long a
    #: location stays WRITING, its session gone, before it is an orphan (at least an hour
    #: and ``max_write_timeout_s``); the pause after each pass over every instance.
    cache_gc: bool = True
    cache_gc_orphan_grace_s: int = 86_400
    cache_gc_round_pause_s: int = 7_200
    #: CloudWatch namespace of the few metrics the template's alarms watch, written as EMF
    #: log lines (observability.emf); empty: none written (the local stage).
    metrics_namespace: str = ""
    #: A file storage (NFS, 3FS) with less free space than this is FULL: its blocks are
    #: still served, but no new block is placed on it (storage health, README "Health").
    storage_min_free_bytes: int = 64 * 1024 * 1024

    @classmethod
    def from_env(cls) -> Settings:
        """Read ``KVCM_*`` variables; unset ones keep their defaults."""
        base = cls()
        return cls(
            stage=os.environ.get("KVCM_STAGE", base.stage),
            valkey_url=os.environ.get("KVCM_VALKEY_URL", base.valkey_url),
            valkey_cluster=_env_bool("KVCM_VALKEY_CLUSTER", base.valkey_cluster),
            valkey_username=os.environ.get("KVCM_VALKEY_USERNAME", base.valkey_username),
            valkey_password=os.environ.get("KVCM_VALKEY_PASSWORD", base.valkey_password),
            valkey_secret_arn=os.environ.get("KVCM_VALKEY_SECRET_ARN", base.valkey_secret_arn),
            key_prefix=os.environ.get("KVCM_KEY_PREFIX", base.key_prefix),
            control_table=os.environ.get("KVCM_CONTROL_TABLE", base.control_table),
            metrics_namespace=os.environ.get("KVCM_METRICS_NAMESPACE", base.metrics_namespace),
            aws_region=os.environ.get("AWS_REGION", os.environ.get("AWS_DEFAULT_REGION", base.aws_region)),
            node_id=os.environ.get("KVCM_NODE_ID", base.node_id),
            debug_service=_env_bool("KVCM_DEBUG_SERVICE", base.debug_service),
            auth_enabled=_env_bool("KVCM_AUTH", base.auth_enabled),
            default_write_timeout_s=_env_int("KVCM_DEFAULT_WRITE_TIMEOUT_S", base.default_write_timeout_s),
            max_write_timeout_s=_env_int("KVCM_MAX_WRITE_TIMEOUT_S", base.max_write_timeout_s),
            prune_stale_on_write=_env_bool("KVCM_PRUNE_STALE_ON_WRITE", base.prune_stale_on_write),
            max_keys_per_request=_env_int("KVCM_MAX_KEYS_PER_REQUEST", base.max_keys_per_request),
            max_write_sessions=_env_int("KVCM_MAX_WRITE_SESSIONS", base.max_write_sessions),
            max_write_sessions_per_caller=_env_int(
                "KVCM_MAX_WRITE_SESSIONS_PER_CALLER", base.max_write_sessions_per_caller
            ),
            config_refresh_s=_env_float("KVCM_CONFIG_REFRESH_S", base.config_refresh_s),
            default_group_max_instances=_env_int("KVCM_DEFAULT_GROUP_MAX_INSTANCES", base.default_group_max_instances),
            lease_ttl_ms=_env_int("KVCM_LEASE_TTL_MS", base.lease_ttl_ms),
            event_log_path=os.environ.get("KVCM_EVENT_LOG", base.event_log_path),
            event_log_tokens=_env_bool("KVCM_EVENT_LOG_TOKENS", base.event_log_tokens),
            hit_feed_rate=_env_float("KVCM_HIT_FEED_RATE", base.hit_feed_rate),
            hit_feed_max_len=_env_int("KVCM_HIT_FEED_MAX_LEN", base.hit_feed_max_len),
            hit_curve_s_max=_env_int("KVCM_HIT_CURVE_S_MAX", base.hit_curve_s_max),
            valkey_connect_timeout_s=_env_float("KVCM_VALKEY_CONNECT_TIMEOUT_S", base.valkey_connect_timeout_s),
            valkey_socket_timeout_s=_env_float("KVCM_VALKEY_SOCKET_TIMEOUT_S", base.valkey_socket_timeout_s),
            max_body_bytes=_env_int("KVCM_MAX_BODY_BYTES", base.max_body_bytes),
            max_trace_id_length=_env_int("KVCM_MAX_TRACE_ID_LENGTH", base.max_trace_id_length),
            api_key_default_ttl_s=_env_int("KVCM_API_KEY_DEFAULT_TTL_S", base.api_key_default_ttl_s),
            api_key_max_ttl_s=_env_int("KVCM_API_KEY_MAX_TTL_S", base.api_key_max_ttl_s),
            audit_ttl_days=_env_int("KVCM_AUDIT_TTL_DAYS", base.audit_ttl_days),
            gateway_authorizer=_env_bool("KVCM_GATEWAY_AUTHORIZER", base.gateway_authorizer),
            reaper_state_machine_arn=os.environ.get("KVCM_REAPER_STATE_MACHINE_ARN", ""),
            delete_state_machine_arn=os.environ.get("KVCM_DELETE_STATE_MACHINE_ARN", ""),
            sweep_state_machine_arn=os.environ.get("KVCM_SWEEP_STATE_MACHINE_ARN", ""),
            purge_state_machine_arn=os.environ.get("KVCM_PURGE_STATE_MACHINE_ARN", ""),
            copy_state_machine_arn=os.environ.get("KVCM_COPY_STATE_MACHINE_ARN", ""),
            advertised_endpoint=os.environ.get("KVCM_ADVERTISED_ENDPOINT", base.advertised_endpoint),
            cache_gc=_env_bool("KVCM_CACHE_GC", base.cache_gc),
            cache_gc_orphan_grace_s=_env_int("KVCM_CACHE_GC_ORPHAN_GRACE_S", base.cache_gc_orphan_grace_s),
            cache_gc_round_pause_s=_env_int("KVCM_CACHE_GC_ROUND_PAUSE_S", base.cache_gc_round_pause_s),
            storage_min_free_bytes=_env_int("KVCM_STORAGE_MIN_FREE_BYTES", base.storage_min_free_bytes),
        )
