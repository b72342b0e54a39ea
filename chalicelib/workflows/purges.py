"""Whole-instance purges through the ``instance_purge`` state machine: its task runs one
step after another, a fresh execution every ``MAX_STEPS`` steps (execution history stays
small whatever the instance's size), and a scheduled watchdog resumes removals whose
execution died."""
from __future__ import annotations

from typing import Any, Callable, Optional

from ..cache.purge import PurgeJob
from . import executions

#: Steps per execution before it hands over to a fresh one.
MAX_STEPS = 500


def starter(runtime: Any) -> Optional[Callable[[dict], str]]:
    """Hands a job to the state machine (None when none is configured)."""
    arn = runtime.settings.purge_state_machine_arn
    if not arn:
        return None
    return lambda job: executions.start(runtime.aws("stepfunctions"), arn, "purge",
                                        {**job, "max_steps": MAX_STEPS, "round_steps": 0})


def purge_step(runtime: Any, event: dict) -> dict:
    """Task of ``instance_purge``: one step of the job; the state machine loops on
    ``done``, handing over after ``max_steps`` steps. Raises on a storage or index
    failure so the state machine retries (steps are idempotent)."""
    job = runtime.purge.step(PurgeJob.from_json(event))
    return {**job.to_json(), "max_steps": event.get("max_steps", MAX_STEPS),
            "round_steps": event.get("round_steps", 0) + 1}


def purge_continue(runtime: Any, event: dict) -> dict:
    """Start the next execution of the state machine running this task with the job as
    it stands (the current execution ends after it)."""
    machine = executions.state_machine_of(event.get("execution", "")) or runtime.settings.purge_state_machine_arn
    job = PurgeJob.from_json(event["job"])
    arn = executions.start(runtime.aws("stepfunctions"), machine, "purge",
                           {**job.to_json(), "max_steps": event.get("max_steps", MAX_STEPS), "round_steps": 0})
    return {"next_execution": arn}


def purge_watchdog(runtime: Any) -> dict:
    """Resume the removals still in progress that no execution is working on."""
    arn = runtime.settings.purge_state_machine_arn
    if arn and executions.running(runtime.aws("stepfunctions"), arn):
        return {"running": True, "resumed": []}
    return {"running": False, "resumed": runtime.purge.resume_removals()}
