"""EventBridge schedules, locally: a thread per job calling it at start, then at its period.

Jobs come from the app's ``@app.schedule`` handlers (called with a CloudWatch scheduled
event, like EventBridge does) plus the stack's own housekeeping. A job that raises is
logged and called again at its next period, as a failed scheduled Lambda would be.

A test can take jobs off their timers (``Scheduler.driven``) and call them itself at
fixed points of its traffic: what a run does then depends on the traffic, not on the
machine's pace against the timer.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from chalicelib.clock import Clock
from chalicelib.observability.logging import logger
from chalicelib.protocol.errors import ServiceNotReadyError

from .config import schedule_key
from .dispatch import LambdaContext

LOCAL_ACCOUNT = "123456789012"
#: Period of a ``cron(...)`` schedule locally (cron is not interpreted; override per name).
CRON_PERIOD_S = 60.0
_UNIT_SECONDS = {"minute": 60, "hour": 3600, "day": 86400}
_RATE = re.compile(r"^rate\(\s*(\d+)\s+(minute|hour|day)s?\s*\)$", re.IGNORECASE)


@dataclass(frozen=True)
class Job:
    """Something to call at start, then every ``period_s`` seconds."""

    name: str
    period_s: float
    run: Callable[[], Any]


def period_of(expression: Any) -> float:
    """Seconds between runs of a schedule expression (``rate(...)``, ``Rate``, ``cron(...)``)."""
    text = expression if isinstance(expression, str) else expression.to_string()
    match = _RATE.match(text.strip())
    if match:
        return int(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()]
    if text.strip().lower().startswith("cron("):
        return CRON_PERIOD_S
    raise ValueError(f"unsupported schedule expression {text!r}")


def scheduled_event(rule_name: str, region: str, clock: Clock) -> dict[str, Any]:
    """The event EventBridge passes to a scheduled Lambda."""
    when = datetime.fromtimestamp(clock.now(), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": LOCAL_ACCOUNT,
        "time": when,
        "region": region,
        "resources": [f"arn:aws:events:{region}:{LOCAL_ACCOUNT}:rule/{rule_name}"],
        "detail": {},
    }


def app_jobs(app: Any, overrides: Mapping[str, float], region: str, clock: Clock) -> list[Job]:
    """A job per ``@app.schedule`` handler; ``overrides`` (by ``schedule_key``) replace its rate."""
    from chalice.app import ScheduledEventConfig

    jobs = []
    for source in app.event_sources:
        if isinstance(source, ScheduledEventConfig):
            handler = app.handler_map[source.name]
            period = overrides.get(schedule_key(source.name)) or period_of(source.schedule_expression)

            def run(handler: Callable[[Any, Any], Any] = handler, name: str = source.name) -> Any:
                context = LambdaContext(name, f"arn:aws:lambda:{region}:{LOCAL_ACCOUNT}:function:{name}", clock=clock)
                return handler(scheduled_event(name, region, clock), context)

            jobs.append(Job(source.name, float(period), run))
    return jobs


class Scheduler:
    """Runs jobs on daemon threads until ``stop``; a job never overlaps with itself."""

    def __init__(self, jobs: list[Job]) -> None:
        self.jobs = jobs
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._by_name = {job.name: job for job in jobs}
        #: Held across each call of a job, by its thread or by a driver: one call at a time.
        self._calling = {job.name: threading.Lock() for job in jobs}
        self._driven: set[str] = set()

    @contextmanager
    def driven(self, *names: str) -> Iterator[Callable[[str], Any]]:
        """Take the jobs ``names`` off their timers for the block: they run only when the
        yielded ``run(name)`` is called (it returns what the job returns and raises what it
        raises). A call of theirs running when the block starts is waited for."""
        if unknown := sorted(set(names) - set(self._by_name)):
            raise ValueError(f"no scheduled job named {', '.join(unknown)}")
        if taken := sorted(self._driven.intersection(names)):
            raise RuntimeError(f"scheduled jobs already driven: {', '.join(taken)}")
        self._driven.update(names)
        try:
            for name in names:
                with self._calling[name]:  # the timer's running call, if any, ends first
                    pass
            yield self._run_driven
        finally:
            self._driven.difference_update(names)

    def _run_driven(self, name: str) -> Any:
        if name not in self._driven:
            raise RuntimeError(f"scheduled job {name} is not driven: its timer calls it")
        with self._calling[name]:
            return self._by_name[name].run()

    def start(self) -> None:
        self._stop.clear()
        self._threads = [
            threading.Thread(target=self._loop, args=(job,), name=f"kvcm-local-schedule-{job.name}", daemon=True)
            for job in self.jobs
        ]
        for thread in self._threads:
            thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Signal every job and wait, ``timeout_s`` in all, for running calls to finish; a
        call still running then is logged and left to its daemon thread (a stop must not
        hang on one job)."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if running := [thread.name for thread in self._threads if thread.is_alive()]:
            logger.warning("scheduled jobs still running at stop, left behind: %s", ", ".join(running))
        self._threads = []

    def _loop(self, job: Job) -> None:
        # The first call is at start, not one period later: a minute without, say, the
        # reaper watchdog would leave expired write sessions alone for that long. Waiting on
        # the event rather than sleeping makes stop immediate; the period runs from the end
        # of a call, so a slow call delays the next one instead of piling calls up.
        # A dependency that does not answer (Valkey restarting) is one line when it starts
        # and one when it ends, not a traceback every period.
        not_ready = ""
        calling = self._calling[job.name]
        while True:
            try:
                with calling:  # a driven job is skipped (checked under the lock its driver takes)
                    if job.name not in self._driven:
                        job.run()
                if not_ready:
                    logger.warning("scheduled job %s runs again", job.name)
                    not_ready = ""
            except ServiceNotReadyError as exc:
                if not not_ready:
                    logger.warning("scheduled job %s failed: %s (retried every %g s)", job.name, exc, job.period_s)
                not_ready = str(exc) or type(exc).__name__
            except Exception:  # noqa: BLE001 - a failed run is logged and retried next period
                logger.exception("scheduled job %s failed", job.name)
            if self._stop.wait(job.period_s):
                return
