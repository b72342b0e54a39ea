"""Whole-instance purges through the ``instance_purge`` state machine: its task runs one
step after another, a fresh execution every ``MAX_STEPS`` steps (execution history stays
small whatever the instance's size), and a scheduled watchdog resumes removals whose
execution died."""

from __future__ import annotations

from typing import Any

from ..cache.purge import PurgeJob, PurgeService
from .executions import StateMachine

#: Steps per execution before it hands over to a fresh one.
MAX_STEPS = 500


def purge_input(job: dict[str, Any]) -> dict[str, Any]:
    """An execution's input: the job and its hand-over counters."""
    return {**job, "max_steps": MAX_STEPS, "round_steps": 0}


class PurgeExecutions:
    """The ``instance_purge`` state machine's tasks and its watchdog."""

    def __init__(self, purge: PurgeService, machine: StateMachine) -> None:
        self.purge = purge
        self.machine = machine

    def purge_step(self, event: dict[str, Any]) -> dict[str, Any]:
        """Task of ``instance_purge``: one step of the job; the state machine loops on
        ``done``, handing over after ``max_steps`` steps. Raises on a storage or index
        failure so the state machine retries (steps are idempotent)."""
        job = self.purge.step(PurgeJob.from_json(event))
        return {
            **job.to_json(),
            "max_steps": event.get("max_steps", MAX_STEPS),
            "round_steps": event.get("round_steps", 0) + 1,
        }

    def purge_continue(self, event: dict[str, Any]) -> dict[str, Any]:
        """Start the next execution of the state machine running this task with the job as
        it stands (the current execution ends after it)."""
        job = PurgeJob.from_json(event["job"])
        return {
            "next_execution": self.machine.continue_as_new(
                event, {**job.to_json(), "max_steps": event.get("max_steps", MAX_STEPS), "round_steps": 0}
            )
        }

    def purge_watchdog(self) -> dict[str, Any]:
        """Resume the removals still in progress that no execution is working on."""
        if self.machine.running():
            return {"running": True, "resumed": []}
        return {"running": False, "resumed": self.purge.resume_removals()}
