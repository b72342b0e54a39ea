"""Admin migrateCache (UPSTREAM_V2 §2.11; docs/api-v2.md "migrateCache")."""

from __future__ import annotations

import random

from ..cache.contexts import ContextProvider
from ..capacity import coldest_blocks
from ..clock import Clock
from ..control import ConfigCache
from ..index import BlockIndex, Status
from ..index.types import MODE_RAW
from ..protocol.codes import MigrationMethod, MigrationRetention
from ..protocol.errors import InvalidArgumentError, UnsupportedError
from ..protocol.models import MigrateCacheRequest, MigrateCacheResponse
from ..protocol.validation import require_name
from ..workflows.migrations import EXECUTION_SIZE, TierCopies

#: Blocks a ``rule.sample_count`` of 0 or less selects (upstream's default).
DEFAULT_SAMPLE_COUNT = 100


class MigrationAdmin:
    """migrateCache: checks the whole request, then starts one tier_copy execution."""

    def __init__(
        self,
        config: ConfigCache,
        contexts: ContextProvider,
        index: BlockIndex,
        copies: TierCopies,
        clock: Clock,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.contexts = contexts
        self.index = index
        self.copies = copies
        self.clock = clock
        self.rng = rng or random.Random()

    def migrate_cache(self, request: MigrateCacheRequest) -> MigrateCacheResponse:
        """Copy ``block_keys`` from the source storage to the target (upstream's admin Copy
        deletes the source once the target serves: DELETE_SOURCE). Answers at once with the
        blocks accepted (a SERVING location on the source now) and the execution's ARN.
        Without ``block_keys``, ``rule.sample_count`` (100 when 0 or less) of the coldest
        blocks on the source the target does not hold, by the group's reclaim policy over a
        sample (``capacity.coldest_blocks``)."""
        instance_id = require_name(request.instance_id, "instance_id")
        if request.method == MigrationMethod.MIGRATION_METHOD_UNSPECIFIED:
            raise InvalidArgumentError("field 'method' is required (MIGRATION_METHOD_COPY)")
        if request.method != MigrationMethod.MIGRATION_METHOD_COPY:
            raise UnsupportedError(f"field 'method': {request.method.name} is not supported yet (only COPY)")
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
        if ctx.layout.shard_suffixes:
            raise UnsupportedError(
                f"field 'instance_id': instance '{instance_id}' is sharded: Copy does not cover it yet"
            )
        keys = list(dict.fromkeys(request.block_keys))
        if sample_count:
            chosen = coldest_blocks(
                self.index, ctx, source, sample_count, int(self.clock.now()), self.rng, absent_from=target
            )
            keys = [c.block_key for c in chosen]
        held = {i for i, n in self.index.storage_names(ctx.layout).items() if n == source}
        accepted = [
            key
            for key, record in zip(keys, self.index.read(ctx.layout, keys, MODE_RAW), strict=True)
            if record is not None
            and any(loc.storage_index in held and loc.status == Status.SERVING for loc in record.locations)
        ]
        arn = ""
        if accepted:
            arn = self.copies.submit(
                ctx, source, target, accepted, MigrationRetention.MIGRATION_RETENTION_DELETE_SOURCE
            )
        return MigrateCacheResponse(accepted=len(accepted), rejected=len(keys) - len(accepted), execution_arn=arn)
