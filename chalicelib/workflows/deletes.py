"""Batched asynchronous deletion through the ``batched_delete`` state machine."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..cache.context import InstanceContext
from ..cache.contexts import ContextProvider
from ..cache.deletion import DeletionService
from ..index import Victim
from . import executions

#: Victims per Map item (one delete_batch invocation) and per execution (input ≤ 256 KB).
BATCH_SIZE = 256
EXECUTION_SIZE = 2048


class StepFunctionsDeleter:
    """Hands victims to ``batched_delete`` executions (the Deleter of deployed stages)."""

    def __init__(self, sfn_factory: Callable[[], Any], state_machine_arn: str) -> None:
        self._sfn_factory = sfn_factory
        self._arn = state_machine_arn

    def submit(self, ctx: InstanceContext, victims: Sequence[Victim], delay_ms: int = 0) -> None:
        for start in range(0, len(victims), EXECUTION_SIZE):
            chunk = [v.to_json() for v in victims[start : start + EXECUTION_SIZE]]
            executions.start(
                self._sfn_factory(),
                self._arn,
                f"delete-{ctx.instance_id}",
                {
                    "instance_id": ctx.instance_id,
                    "delay_s": max(0, delay_ms) // 1000,
                    "batches": [chunk[i : i + BATCH_SIZE] for i in range(0, len(chunk), BATCH_SIZE)],
                },
            )


def delete_batch(contexts: ContextProvider, deletion: DeletionService, event: dict[str, Any]) -> dict[str, Any]:
    """Task of ``batched_delete``: delete one batch of one instance. Raises on a storage
    failure so the state machine retries; a retry deletes nothing twice."""
    ctx = contexts(event["instance_id"])
    report = deletion.delete(ctx, [Victim.from_json(v) for v in event["victims"]])
    return {
        "instance_id": ctx.instance_id,
        "requested": report.requested,
        "claimed": report.claimed,
        "dropped": report.dropped,
        "groups_deleted": report.groups_deleted,
    }
