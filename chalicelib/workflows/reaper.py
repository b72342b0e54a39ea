"""The write-session reaper: fails sessions past their deadline.

``expire_write_sessions`` is the task the ``write_session_reaper`` state machine runs in
a loop; ``reaper_continue`` starts the next execution when one has run its rounds;
``reaper_watchdog`` (scheduled) starts one when none is running.
"""
from __future__ import annotations

from ..observability.logging import logger
from ..protocol.errors import InstanceNotFoundError
from . import executions

#: Loop period: a session is failed at most about this long after its deadline.
INTERVAL_S = 2
#: Rounds per execution before it hands over to a fresh one.
MAX_ROUNDS = 500


def expire_write_sessions(runtime) -> dict:
    """Fail every write session past its deadline: its WRITING locations go to deletion
    and a later finish is refused. Only the lease holder works; others skip."""
    if not runtime.lease.try_acquire():
        return {"skipped": "lease held by another node", "expired": 0}
    now_ms = int(runtime.clock.now() * 1000)
    instance_ids = [r.instance_id for r in runtime.control.list_instances()]
    expired = blocks = 0
    for instance_id, session_ids in runtime.index.due_sessions(instance_ids, now_ms).items():
        try:
            ctx = runtime.contexts(instance_id)
        except InstanceNotFoundError:
            continue
        for session_id in session_ids:
            failed = runtime.cache.fail_session(ctx, session_id)
            if failed is not None:  # None: finished meanwhile
                expired += 1
                blocks += failed
    if expired:
        logger.info("expired write sessions", extra={"sessions": expired, "blocks": blocks})
    return {"expired": expired, "blocks": blocks}


def reaper_input() -> dict:
    return {"interval_s": INTERVAL_S, "max_rounds": MAX_ROUNDS}


def reaper_continue(runtime, event: dict) -> dict:
    """Start the next execution of the state machine running this task (the current
    execution ends after it)."""
    machine = executions.state_machine_of(event.get("execution", "")) or runtime.settings.reaper_state_machine_arn
    arn = executions.start(runtime.aws("stepfunctions"), machine, "reaper",
                           {"interval_s": event.get("interval_s", INTERVAL_S),
                            "max_rounds": event.get("max_rounds", MAX_ROUNDS)})
    return {"next_execution": arn}


def reaper_watchdog(runtime) -> dict:
    """Start a reaper execution unless one is running."""
    sfn = runtime.aws("stepfunctions")
    arn = runtime.settings.reaper_state_machine_arn
    running = executions.running(sfn, arn)
    if running:
        return {"running": running[0]}
    return {"started": executions.start(sfn, arn, "reaper", reaper_input())}
