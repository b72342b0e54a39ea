"""The write-session reaper: fails sessions past their deadline.

``expire_write_sessions`` is the task the ``write_session_reaper`` state machine runs in
a loop; ``reaper_continue`` starts the next execution when one has run its rounds;
``reaper_watchdog`` (scheduled) starts one when none is running.
"""

from __future__ import annotations

from typing import Any

from ..cache.contexts import ContextProvider
from ..cache.service import CacheService
from ..clock import Clock, now_ms
from ..control import ControlPlane
from ..index import BlockIndex
from ..observability.emf import EmfWriter
from ..observability.logging import logger
from ..observability.metrics import MetricsRegistry
from ..protocol.errors import InstanceNotFoundError
from ..stores.lease import Lease
from .executions import StateMachine
from .migrations import COPY_SESSION_PREFIX
from .quarantine import CopyQuarantine

#: Loop period: a session is failed at most about this long after its deadline.
INTERVAL_S = 2
#: Rounds per execution before it hands over to a fresh one.
MAX_ROUNDS = 500
#: A round reads only the instances the index's due set names (work to do, not every
#: instance); every this often, and at a container's first round, it reads every
#: registered instance instead: a start that died between its script and the due set left
#: its session out of it. The full sweep also recounts each instance's open sessions per
#: caller (``BlockIndex.recount_caller_sessions``): counts an older version left too high.
FULL_SWEEP_S = 600


def reaper_input() -> dict[str, Any]:
    return {"interval_s": INTERVAL_S, "max_rounds": MAX_ROUNDS}


class SessionReaper:
    """The ``write_session_reaper`` state machine's task, its hand-over and its watchdog."""

    def __init__(
        self,
        lease: Lease,
        control: ControlPlane,
        index: BlockIndex,
        contexts: ContextProvider,
        cache: CacheService,
        clock: Clock,
        machine: StateMachine,
        metrics: MetricsRegistry,
        emf: EmfWriter,
        quarantine: CopyQuarantine,
    ) -> None:
        self.lease = lease
        self.control = control
        self.index = index
        self.contexts = contexts
        self.cache = cache
        self.clock = clock
        self.machine = machine
        self.metrics = metrics
        self.emf = emf
        self.quarantine = quarantine
        self._next_full_sweep = float("-inf")

    def expire_write_sessions(self) -> dict[str, Any]:
        """Fail every write session past its deadline: its WRITING locations go to deletion
        and a later finish is refused. A quarantined Copy is due at its release time: it is
        released, not expired. Reads the instances the due set names (a full sweep every
        ``FULL_SWEEP_S``); only the lease holder works, others skip."""
        if not self.lease.try_acquire():
            return {"skipped": "lease held by another node", "expired": 0}
        now = now_ms(self.clock)
        if self.clock.now() >= self._next_full_sweep:
            self._next_full_sweep = self.clock.now() + FULL_SWEEP_S
            instance_ids = [r.instance_id for r in self.control.list_instances()]
            recounted = self.index.recount_caller_sessions(instance_ids)
            if recounted:
                logger.warning("repaired per-caller session counts", extra={"counts": recounted})
        else:
            instance_ids = self.index.instances_due(now)
        expired = blocks = copies = released = 0
        for instance_id, session_ids in self.index.due_sessions(instance_ids, now).items():
            try:
                ctx = self.contexts(instance_id)
            except InstanceNotFoundError:
                continue
            for session_id in session_ids:
                if session_id.startswith(COPY_SESSION_PREFIX):
                    freed = self.quarantine.release_due(ctx, session_id)
                    if freed is not None:  # quarantined: released once its writer is dead
                        released += freed > 0
                        continue
                failed = self.cache.fail_session(ctx, session_id)
                if failed is not None:  # None: finished meanwhile
                    expired += 1
                    blocks += failed
                    if session_id.startswith(COPY_SESSION_PREFIX):
                        copies += 1
                        tags = {"instance_group": ctx.group.name}
                        self.metrics.incr("migration.copy_sessions_expired_total", 1, tags)
        self.index.rearm_session_deadlines(instance_ids)
        if copies:
            # A tiered Copy batch not finished COPY_SESSION_TTL_S after its begin (longer than
            # every retry of its steps): its execution died or is stuck (TierCopyStuckAlarm).
            self.emf.emit({"Service": "kvcm"}, {"ExpiredCopySessions": copies})
        if expired:
            # Engines that start writes and never finish them (crashed, or timeouts too short).
            self.metrics.incr("write_session.expired_count", expired)
            self.metrics.incr("write_session.expired_block_count", blocks)
            self.emf.emit({"Service": "kvcm"}, {"ExpiredWriteSessions": expired})
            logger.info("expired write sessions", extra={"sessions": expired, "blocks": blocks})
        outcome = {"expired": expired, "blocks": blocks}
        if released:
            outcome["released"] = released
        return outcome

    def reaper_continue(self, event: dict[str, Any]) -> dict[str, Any]:
        """Start the next execution of the state machine running this task (the current
        execution ends after it)."""
        return {
            "next_execution": self.machine.continue_as_new(
                event,
                {"interval_s": event.get("interval_s", INTERVAL_S), "max_rounds": event.get("max_rounds", MAX_ROUNDS)},
            )
        }

    def reaper_watchdog(self) -> dict[str, Any]:
        """Start a reaper execution unless one is running."""
        running = self.machine.running()
        if running:
            return {"running": running[0]}
        return {"started": self.machine.start(reaper_input())}
