"""Admin migrateCache (UPSTREAM_V2 §2.11; docs/api-v2.md "migrateCache")."""

from __future__ import annotations

import random

from ..cache.context import InstanceContext
from ..cache.contexts import ContextProvider
from ..cache.marks import record_marks, spec_group_coverage
from ..capacity import coldest_blocks
from ..clock import Clock, now_ms
from ..control import ConfigCache
from ..control.groups import DEFAULT_MARK_TIMEOUT_MS
from ..index import BlockIndex, Status
from ..index.migration import MigrationIndex
from ..index.types import MODE_RAW, MarkCounts
from ..observability.metrics import MetricsRegistry
from ..protocol.codes import MigrationMethod, MigrationRetention
from ..protocol.errors import InvalidArgumentError
from ..protocol.models import InstanceGroup, MigrateCacheRequest, MigrateCacheResponse
from ..protocol.validation import require_name
from ..workflows.migrations import EXECUTION_SIZE, TierCopies

_COPY_METHODS = (MigrationMethod.MIGRATION_METHOD_COPY, MigrationMethod.MIGRATION_METHOD_BOTH)
_MARK_METHODS = (MigrationMethod.MIGRATION_METHOD_MARK, MigrationMethod.MIGRATION_METHOD_BOTH)


def mark_timeout_ms(group: InstanceGroup, source: str, target: str) -> int:
    """How long a Mark for ``target`` lasts: the ``method_configs.mark.timeout_ms`` of the
    group's strategy for (source, target), else of one into ``target``, else 24 h."""
    cache = group.cache_config
    strategies = cache.migration_config.strategies if cache is not None and cache.migration_config else []
    ranked = sorted(
        (s for s in strategies if s.target_storage_name == target), key=lambda s: s.source_storage_name != source
    )
    for strategy in ranked:
        mark = strategy.method_configs.mark if strategy.method_configs is not None else None
        if mark is not None and mark.timeout_ms is not None:
            return mark.timeout_ms
    return DEFAULT_MARK_TIMEOUT_MS


#: Blocks a ``rule.sample_count`` of 0 or less selects (upstream's default).
DEFAULT_SAMPLE_COUNT = 100


class MigrationAdmin:
    """migrateCache: checks the whole request, then starts one tier_copy execution and/or
    marks blocks (one step)."""

    def __init__(
        self,
        config: ConfigCache,
        contexts: ContextProvider,
        index: BlockIndex,
        copies: TierCopies,
        migration: MigrationIndex,
        clock: Clock,
        metrics: MetricsRegistry,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.contexts = contexts
        self.index = index
        self.copies = copies
        self.migration = migration
        self.clock = clock
        self.metrics = metrics
        self.rng = rng or random.Random()

    def migrate_cache(self, request: MigrateCacheRequest) -> MigrateCacheResponse:
        """COPY: Copy ``block_keys`` from the source storage to the target (upstream's admin
        Copy deletes the source once the target serves: DELETE_SOURCE). MARK: mark them for
        the target. BOTH: Copy the blocks it takes, mark the others. Answers at once with
        the blocks accepted (handed to the Copy: a SERVING location on the source now; or
        marked) and the execution's ARN. Without ``block_keys``, ``rule.sample_count`` (100
        when 0 or less) of the coldest blocks on the source the target does not hold, by the
        group's reclaim policy over a sample (``capacity.coldest_blocks``)."""
        instance_id = require_name(request.instance_id, "instance_id")
        if request.method == MigrationMethod.MIGRATION_METHOD_UNSPECIFIED:
            raise InvalidArgumentError("field 'method' is required (MIGRATION_METHOD_COPY, _MARK or _BOTH)")
        sample_count = 0
        if not request.block_keys:
            if request.rule is None:
                raise InvalidArgumentError("field 'block_keys' is required (or 'rule.sample_count')")
            sample_count = request.rule.sample_count if request.rule.sample_count > 0 else DEFAULT_SAMPLE_COUNT
            if sample_count > EXECUTION_SIZE:
                raise InvalidArgumentError(f"field 'rule.sample_count': {sample_count}, at most {EXECUTION_SIZE}")
        if len(request.block_keys) > EXECUTION_SIZE:
            raise InvalidArgumentError(f"field 'block_keys': {len(request.block_keys)} keys, at most {EXECUTION_SIZE}")
        # From the config alone, before the instance's context (which sets up its index keys).
        group = self.config.group(self.config.instance(instance_id).group)
        cache = group.cache_config
        if request.method in _MARK_METHODS and not (
            cache is not None and cache.migration_config is not None and cache.migration_config.strategies
        ):
            raise InvalidArgumentError(
                f"field 'method': {request.method.name} needs a migration strategy in group '{group.name}' "
                f"(cache_config.migration_config.strategies is empty)"
            )
        names = {}
        for field in ("source_storage_name", "target_storage_name"):
            names[field] = require_name(getattr(request, field), field)
            if names[field] not in group.storage_candidates:
                raise InvalidArgumentError(
                    f"field '{field}': {names[field]!r} is not a storage candidate of group '{group.name}'"
                )
        source, target = names["source_storage_name"], names["target_storage_name"]
        if source == target:
            raise InvalidArgumentError("field 'target_storage_name' must differ from source_storage_name")
        ctx = self.contexts(instance_id)
        target_backend = ctx.backend(target)
        if target_backend is None:  # a candidate the instance's context has no backend for
            raise InvalidArgumentError(f"field 'target_storage_name': {target!r} is not a storage of the instance")
        target_type = target_backend.storage_type.name
        keys = list(dict.fromkeys(request.block_keys))
        if sample_count:
            chosen = coldest_blocks(
                self.index, ctx, source, sample_count, int(self.clock.now()), self.rng, absent_from=target
            )
            keys = [c.block_key for c in chosen]
        held = {i for i, n in self.index.storage_names(ctx.layout).items() if n == source}
        on_source = [
            key
            for key, record in zip(keys, self.index.read(ctx.layout, keys, MODE_RAW), strict=True)
            if record is not None
            and any(loc.storage_index in held and loc.status == Status.SERVING for loc in record.locations)
        ]
        copied = on_source if request.method in _COPY_METHODS else []
        arn = ""
        if copied:
            arn = self.copies.submit(ctx, source, target, copied, MigrationRetention.MIGRATION_RETENTION_DELETE_SOURCE)
        marked = 0
        if request.method == MigrationMethod.MIGRATION_METHOD_MARK:
            marked = self._mark(ctx, group, source, (target, target_type), on_source)
        elif request.method == MigrationMethod.MIGRATION_METHOD_BOTH:
            taken = set(copied)
            marked = self._mark(ctx, group, source, (target, target_type), [k for k in keys if k not in taken])
        accepted = len(copied) + marked
        return MigrateCacheResponse(accepted=accepted, rejected=len(keys) - accepted, execution_arn=arn)

    def _mark(
        self, ctx: InstanceContext, group: InstanceGroup, source: str, target: tuple[str, str], keys: list[int]
    ) -> int:
        """Mark ``keys`` for ``target`` (name, storage type) with MigrationIndex.mark;
        returns how many were marked."""
        if not keys:
            return 0
        result = self.migration.mark(
            ctx.layout,
            keys,
            target[0],
            target[1],
            now_ms(self.clock) + mark_timeout_ms(group, source, target[0]),
            spec_group_coverage(ctx),
            len(ctx.spec_layout.sizes),
        )
        record_marks(self.metrics, ctx, MarkCounts(active=result.active))
        return result.accepted
