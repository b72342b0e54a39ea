"""Instance group validation and defaults.

A stored group is always complete: every sub-message is present and every number that
would break later as a silent 0 is replaced by its default when the group is created or
updated. What a 0 means where it is kept:

- ``max_instance_count`` 0: unlimited instances.
- ``quota.capacity`` 0: no group-wide byte quota (unlimited); ``quota.quota_config[].capacity``
  0: no quota for that storage type. With no capacity, only ``trigger_strategy.used_size``
  can trigger a byte-based reclaim.
- ``cache_config.reclaim_strategy``:
  ``reclaim_policy`` unspecified → ``POLICY_LRU``;
  ``instance_reclaim_budget_policy`` absent → ``GROUP_LRU`` with LRU, ``USAGE_PROPORTIONAL``
  with LFU or TTL (GROUP_LRU given with those is refused);
  ``trigger_strategy.used_percentage`` 0 → ``0.9`` (a fraction of capacity; any positive
  value: above 1 it never triggers, which upstream's own reclaim cases use, with 3.2, to
  switch percentage-triggered reclaim off);
  ``trigger_strategy.used_size`` 0: no absolute byte trigger;
  ``trigger_period_seconds`` 0 → ``10``;
  ``reclaim_step_size`` 0: no byte bound per reclaim round;
  ``reclaim_step_percentage`` 0 → ``10`` (% of capacity freed at most per round, 1..100);
  ``delay_before_delete_ms`` 0: delete right away;
  ``ttl_seconds`` 0: no TTL expiry;
  ``storage_unique_name`` empty: the policy covers all of the group's storages (otherwise it
  must be one of the candidates).
- ``cache_config.meta_indexer_config.max_key_count`` 0: unlimited blocks per instance.
- ``cache_config.migration_config`` (tiered storage, UPSTREAM_V2 §2.11): absent stays absent
  (one tier). Present, upstream's rules: ``copy_max_concurrency`` absent → 1 (> 0); every
  strategy names two different storage candidates (KVCM: they must be candidates), a
  ``trigger_threshold`` in (0, 1), at least one enabled method, a ``retention`` when Copy is
  enabled; ``mark.timeout_ms`` absent → 24 h (> 0); one strategy per (source, target).
  Async-copy knobs: the three limits absent → 0 (>= 0, all > 0 with
  ``MIGRATION_COPY_ASYNC_REQUIRED``); timings absent → upstream's defaults
  (``MIGRATION_TIMING_DEFAULTS``), with 0 < poll_initial <= poll_max < deadline,
  0 < connect <= submit, query < deadline and 16 * max(submit, query) <= deadline.
- ``global_quota_group_name`` empty → the group's own name.
- ``data_storage_strategy`` unspecified: candidates in list order.
- ``instance_quotas`` (KVCM extension): bytes per instance id, each > 0 (an instance not
  listed has no quota of its own), together at most ``quota.capacity`` when that is set;
  at most ``MAX_INSTANCE_QUOTAS`` entries.
- ``tuning`` (KVCM extension): absent → recommend only. ``max_shift`` 0 → ``0.2`` (in
  (0, 1]); ``min_gain`` >= 0; ``window_seconds`` 0 → ``3600``; ``enabled`` needs a
  ``quota.capacity`` to split.
"""

from __future__ import annotations

import math

from ..protocol.codes import (
    InstanceReclaimBudgetPolicy,
    MigrationCopyExecutionMode,
    MigrationRetention,
    ReclaimPolicy,
    StorageType,
)
from ..protocol.models import (
    DEFAULT_RECLAIM_POLICY,
    DEFAULT_RECLAIM_STEP_PERCENTAGE,
    DEFAULT_TRIGGER_PERIOD_S,
    DEFAULT_TUNING_MAX_SHIFT,
    DEFAULT_TUNING_WINDOW_S,
    DEFAULT_USED_PERCENTAGE,
    MAX_INSTANCE_SHARDS,
    CacheConfig,
    CacheReclaimStrategy,
    InstanceGroup,
    InstanceGroupQuota,
    MetaIndexerConfig,
    MigrationConfig,
    MigrationCopyMethodConfig,
    MigrationMarkMethodConfig,
    MigrationMethodConfigs,
    MigrationStrategy,
    TriggerStrategy,
    TuningConfig,
)
from ..protocol.validation import invalid, require_key_name, require_non_negative, require_positive, require_unique
from .validation import MAX_EXTRA_BYTES, MAX_USER_DATA_BYTES, require_bytes_at_most

#: Keeps an update (old and new candidates' references, one existence check per candidate:
#: 1 + 3 * 32 items) inside one 100-item transaction.
MAX_STORAGE_CANDIDATES = 32
#: Keeps a group's item (one DynamoDB item, at most 400 KB) small.
MAX_INSTANCE_QUOTAS = 1024
#: Upstream's defaults for a migration_config's unset wrapped numbers (MigrationConfig).
DEFAULT_COPY_MAX_CONCURRENCY = 1
DEFAULT_MARK_TIMEOUT_MS = 24 * 3600 * 1000
MIGRATION_TIMING_DEFAULTS = {
    "copy_operation_deadline_ms": 600_000,
    "copy_poll_initial_interval_ms": 20,
    "copy_poll_max_interval_ms": 1000,
    "copy_connect_timeout_ms": 1000,
    "copy_submit_timeout_ms": 3000,
    "copy_query_timeout_ms": 3000,
}
#: The async Copy's capacity gates: 0 (unset) is only valid with MIGRATION_COPY_SYNC.
MIGRATION_ASYNC_LIMITS = ("copy_max_inflight_bytes", "copy_max_quarantine_operations", "copy_max_quarantine_bytes")


def normalize_group(group: InstanceGroup | None, path: str = "instance_group") -> InstanceGroup:
    """A validated copy of ``group`` with every default filled in (``version`` untouched).

    Raises InvalidArgumentError naming the first bad field.
    """
    if group is None:
        raise invalid(path, "is required")
    g = group.model_copy(deep=True)
    require_key_name(g.name, f"{path}.name")
    if not g.storage_candidates:
        raise invalid(f"{path}.storage_candidates", "needs at least one storage name")
    if len(g.storage_candidates) > MAX_STORAGE_CANDIDATES:
        raise invalid(f"{path}.storage_candidates", f"lists more than {MAX_STORAGE_CANDIDATES} storages")
    for i, name in enumerate(g.storage_candidates):
        require_key_name(name, f"{path}.storage_candidates[{i}]")
    require_unique(g.storage_candidates, f"{path}.storage_candidates")
    if len(g.event_report_storage_candidates) > MAX_STORAGE_CANDIDATES:
        raise invalid(f"{path}.event_report_storage_candidates", f"lists more than {MAX_STORAGE_CANDIDATES} storages")
    for i, name in enumerate(g.event_report_storage_candidates):
        require_key_name(name, f"{path}.event_report_storage_candidates[{i}]")
    require_unique(g.event_report_storage_candidates, f"{path}.event_report_storage_candidates")
    require_bytes_at_most(g.user_data, MAX_USER_DATA_BYTES, f"{path}.user_data")
    require_bytes_at_most(g.extra_info, MAX_EXTRA_BYTES, f"{path}.extra_info")
    require_bytes_at_most(g.revisit_interval_buckets, MAX_EXTRA_BYTES, f"{path}.revisit_interval_buckets")
    g.global_quota_group_name = g.global_quota_group_name or g.name
    require_non_negative(g.max_instance_count, f"{path}.max_instance_count")
    require_non_negative(g.version, f"{path}.version")
    g.quota = _quota(g.quota or InstanceGroupQuota(), f"{path}.quota")
    g.cache_config = _cache_config(g.cache_config or CacheConfig(), g.storage_candidates, f"{path}.cache_config")
    _instance_quotas(g.instance_quotas, g.quota.capacity, f"{path}.instance_quotas")
    if not 0 <= g.instance_shards <= MAX_INSTANCE_SHARDS:
        raise invalid(
            f"{path}.instance_shards", f"must be between 1 and {MAX_INSTANCE_SHARDS} (0: 1), got {g.instance_shards}"
        )
    if g.tuning is not None:
        g.tuning = _tuning(g.tuning, g.quota.capacity, f"{path}.tuning")
    return g


def _instance_quotas(quotas: dict[str, int], capacity: int, path: str) -> None:
    if len(quotas) > MAX_INSTANCE_QUOTAS:
        raise invalid(path, f"has {len(quotas)} entries, more than the limit of {MAX_INSTANCE_QUOTAS}")
    for instance_id, quota in quotas.items():
        require_key_name(instance_id, f"{path}.{instance_id}" if instance_id else path)
        require_positive(quota, f"{path}.{instance_id}")
    total = sum(quotas.values())
    if capacity > 0 and total > capacity:
        raise invalid(path, f"add up to {total} bytes, more than quota.capacity ({capacity})")


def default_tuning() -> TuningConfig:
    """The tuning settings of a group that sets none: defaults, recommend only."""
    return _tuning(TuningConfig(), 0, "tuning")


def _tuning(tuning: TuningConfig, capacity: int, path: str) -> TuningConfig:
    if tuning.max_shift == 0:
        tuning.max_shift = DEFAULT_TUNING_MAX_SHIFT
    if not (math.isfinite(tuning.max_shift) and 0 < tuning.max_shift <= 1):
        raise invalid(f"{path}.max_shift", f"must be in (0, 1], got {tuning.max_shift}")
    if not (math.isfinite(tuning.min_gain) and tuning.min_gain >= 0):
        raise invalid(f"{path}.min_gain", f"must be a finite fraction >= 0, got {tuning.min_gain}")
    require_non_negative(tuning.window_seconds, f"{path}.window_seconds")
    tuning.window_seconds = tuning.window_seconds or DEFAULT_TUNING_WINDOW_S
    if tuning.enabled and capacity <= 0:
        raise invalid(f"{path}.enabled", "needs quota.capacity: there is no group quota to split")
    return tuning


def _quota(quota: InstanceGroupQuota, path: str) -> InstanceGroupQuota:
    require_non_negative(quota.capacity, f"{path}.capacity")
    for i, entry in enumerate(quota.quota_config):
        if entry.storage_type == StorageType.ST_UNSPECIFIED:
            raise invalid(f"{path}.quota_config[{i}].storage_type", "is required")
        require_non_negative(entry.capacity, f"{path}.quota_config[{i}].capacity")
    require_unique((e.storage_type.name for e in quota.quota_config), f"{path}.quota_config")
    return quota


def _cache_config(config: CacheConfig, candidates: list[str], path: str) -> CacheConfig:
    config.reclaim_strategy = _reclaim(
        config.reclaim_strategy or CacheReclaimStrategy(), candidates, f"{path}.reclaim_strategy"
    )
    indexer = config.meta_indexer_config or MetaIndexerConfig()
    for name in ("max_key_count", "mutex_shard_num", "batch_key_size"):
        require_non_negative(getattr(indexer, name), f"{path}.meta_indexer_config.{name}")
    config.meta_indexer_config = indexer
    if config.migration_config is not None:
        config.migration_config = _migration(config.migration_config, candidates, f"{path}.migration_config")
    return config


def _require_candidate(name: str, candidates: list[str], path: str) -> None:
    if name not in candidates:
        raise invalid(path, f"names {name!r}, which is not one of the storage_candidates")


def _migration(config: MigrationConfig, candidates: list[str], path: str) -> MigrationConfig:
    if config.copy_max_concurrency is None:
        config.copy_max_concurrency = DEFAULT_COPY_MAX_CONCURRENCY
    require_positive(config.copy_max_concurrency, f"{path}.copy_max_concurrency")
    for name in MIGRATION_ASYNC_LIMITS:
        value = getattr(config, name)
        if value is None:
            setattr(config, name, value := 0)
        require_non_negative(value, f"{path}.{name}")
        if config.copy_execution_mode == MigrationCopyExecutionMode.MIGRATION_COPY_ASYNC_REQUIRED and value == 0:
            raise invalid(f"{path}.{name}", "must be > 0 with copy_execution_mode MIGRATION_COPY_ASYNC_REQUIRED")
    timings: dict[str, int] = {}
    for name, default in MIGRATION_TIMING_DEFAULTS.items():
        value = getattr(config, name)
        if value is None:
            setattr(config, name, value := default)
        require_positive(value, f"{path}.{name}")
        timings[name] = value
    _migration_timings(timings, path)
    routes: set[tuple[str, str]] = set()
    demoted: dict[str, int] = {}  # source storage -> the strategy demoting its victims
    for i, strategy in enumerate(config.strategies):
        _migration_strategy(strategy, candidates, f"{path}.strategies[{i}]")
        route = (strategy.source_storage_name, strategy.target_storage_name)
        if route in routes:
            raise invalid(f"{path}.strategies[{i}]", f"repeats the route {route[0]!r} -> {route[1]!r}: one per pair")
        routes.add(route)
        if strategy.demote_on_reclaim:
            source = strategy.source_storage_name
            if source in demoted:
                raise invalid(
                    f"{path}.strategies[{i}].demote_on_reclaim",
                    f"strategies[{demoted[source]}] demotes the victims of {source!r} already: one per source storage",
                )
            demoted[source] = i
    return config


def _migration_timings(timings: dict[str, int], path: str) -> None:
    """The async Copy's timing rules (upstream's tiered-storage design, "校验约束")."""
    for lower, upper in (
        ("copy_poll_initial_interval_ms", "copy_poll_max_interval_ms"),
        ("copy_connect_timeout_ms", "copy_submit_timeout_ms"),
        ("copy_connect_timeout_ms", "copy_query_timeout_ms"),
    ):
        if timings[lower] > timings[upper]:
            raise invalid(f"{path}.{upper}", f"must be >= {lower} ({timings[lower]}), got {timings[upper]}")
    deadline = timings["copy_operation_deadline_ms"]
    for name in ("copy_poll_max_interval_ms", "copy_submit_timeout_ms", "copy_query_timeout_ms"):
        if timings[name] >= deadline:
            raise invalid(f"{path}.{name}", f"must be < copy_operation_deadline_ms ({deadline}), got {timings[name]}")
    slowest = max(timings["copy_submit_timeout_ms"], timings["copy_query_timeout_ms"])
    if 16 * slowest > deadline:
        raise invalid(
            f"{path}.copy_operation_deadline_ms",
            f"must be >= 16 x max(copy_submit_timeout_ms, copy_query_timeout_ms) = {16 * slowest}, got {deadline}",
        )


def _migration_strategy(strategy: MigrationStrategy, candidates: list[str], path: str) -> None:
    for name in ("source_storage_name", "target_storage_name"):
        require_key_name(getattr(strategy, name), f"{path}.{name}")
        _require_candidate(getattr(strategy, name), candidates, f"{path}.{name}")
    if strategy.source_storage_name == strategy.target_storage_name:
        raise invalid(f"{path}.target_storage_name", "must differ from source_storage_name")
    if not (math.isfinite(strategy.trigger_threshold) and 0 < strategy.trigger_threshold < 1):
        raise invalid(f"{path}.trigger_threshold", f"must be a fraction in (0, 1), got {strategy.trigger_threshold}")
    methods = strategy.method_configs or MigrationMethodConfigs()
    methods.copy_config = methods.copy_config or MigrationCopyMethodConfig()
    methods.mark = methods.mark or MigrationMarkMethodConfig()
    strategy.method_configs = methods
    if methods.mark.timeout_ms is None:
        methods.mark.timeout_ms = DEFAULT_MARK_TIMEOUT_MS
    require_positive(methods.mark.timeout_ms, f"{path}.method_configs.mark.timeout_ms")
    if not (methods.copy_config.enabled or methods.mark.enabled):
        raise invalid(f"{path}.method_configs", "must enable copy, mark or both")
    if methods.copy_config.enabled and strategy.retention == MigrationRetention.MIGRATION_RETENTION_UNSPECIFIED:
        raise invalid(f"{path}.retention", "is required when copy is enabled (DELETE_SOURCE or KEEP_BOTH)")
    if strategy.demote_on_reclaim and not (
        methods.copy_config.enabled and strategy.retention == MigrationRetention.MIGRATION_RETENTION_DELETE_SOURCE
    ):
        raise invalid(
            f"{path}.demote_on_reclaim",
            "needs method_configs.copy.enabled and retention MIGRATION_RETENTION_DELETE_SOURCE "
            "(a demote moves the block)",
        )


def _reclaim(strategy: CacheReclaimStrategy, candidates: list[str], path: str) -> CacheReclaimStrategy:
    if strategy.storage_unique_name:
        _require_candidate(strategy.storage_unique_name, candidates, f"{path}.storage_unique_name")
    if (
        strategy.instance_reclaim_budget_policy == InstanceReclaimBudgetPolicy.GROUP_LRU
        and strategy.reclaim_policy not in (ReclaimPolicy.POLICY_UNSPECIFIED, ReclaimPolicy.POLICY_LRU)
    ):
        raise invalid(
            f"{path}.instance_reclaim_budget_policy",
            f"GROUP_LRU orders victims by last access: it goes with POLICY_LRU or POLICY_UNSPECIFIED, "
            f"not {strategy.reclaim_policy.name}",
        )
    if strategy.reclaim_policy == ReclaimPolicy.POLICY_UNSPECIFIED:
        strategy.reclaim_policy = DEFAULT_RECLAIM_POLICY
    strategy.instance_reclaim_budget_policy = strategy.budget_policy()
    trigger = strategy.trigger_strategy or TriggerStrategy()
    require_non_negative(trigger.used_size, f"{path}.trigger_strategy.used_size")
    if trigger.used_percentage == 0:
        trigger.used_percentage = DEFAULT_USED_PERCENTAGE
    if not (math.isfinite(trigger.used_percentage) and trigger.used_percentage > 0):
        raise invalid(
            f"{path}.trigger_strategy.used_percentage",
            f"must be a positive fraction (e.g. 0.9; above 1: never), got {trigger.used_percentage}",
        )
    strategy.trigger_strategy = trigger
    require_non_negative(strategy.trigger_period_seconds, f"{path}.trigger_period_seconds")
    strategy.trigger_period_seconds = strategy.trigger_period_seconds or DEFAULT_TRIGGER_PERIOD_S
    require_non_negative(strategy.reclaim_step_size, f"{path}.reclaim_step_size")
    strategy.reclaim_step_percentage = strategy.reclaim_step_percentage or DEFAULT_RECLAIM_STEP_PERCENTAGE
    if not 1 <= strategy.reclaim_step_percentage <= 100:
        raise invalid(f"{path}.reclaim_step_percentage", f"must be in [1, 100], got {strategy.reclaim_step_percentage}")
    require_non_negative(strategy.delay_before_delete_ms, f"{path}.delay_before_delete_ms")
    require_non_negative(strategy.ttl_seconds, f"{path}.ttl_seconds")
    return strategy
