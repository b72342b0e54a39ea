"""Scheduled handlers run locally: periods, overrides, events, failures, prompt stop."""

from __future__ import annotations

import threading
import time

import pytest
from chalice import Chalice, Rate

from chalicelib.clock import ManualClock
from local_stack.config import LOCAL_SCHEDULE_DEFAULTS, StackConfig, schedule_key
from local_stack.scheduler import CRON_PERIOD_S, Job, Scheduler, app_jobs, period_of


@pytest.mark.parametrize(
    "expression, seconds",
    [
        ("rate(1 minute)", 60),
        ("rate(5 minutes)", 300),
        ("rate(2 hours)", 7200),
        ("rate(1 day)", 86400),
        (Rate(10, unit=Rate.MINUTES), 600),
        ("cron(0 12 * * ? *)", CRON_PERIOD_S),
    ],
)
def test_period_of(expression, seconds):
    assert period_of(expression) == seconds


def test_period_of_rejects_what_it_cannot_schedule():
    with pytest.raises(ValueError):
        period_of("every now and then")


def test_overrides_come_from_the_environment():
    config = StackConfig.from_env({"KVCM_LOCAL_SCHEDULE_WRITE_SESSION_WATCHDOG_S": "0.5"})
    assert config.schedule_periods == {**LOCAL_SCHEDULE_DEFAULTS, "WRITE_SESSION_WATCHDOG": 0.5}
    assert schedule_key("write-session.watchdog") == "WRITE_SESSION_WATCHDOG"


def test_app_schedules_become_jobs_called_with_a_cloudwatch_event():
    app = Chalice(app_name="scheduled")
    seen = []

    @app.schedule("rate(1 hour)", name="reclaim")
    def reclaim(event):
        seen.append(event)

    @app.schedule(Rate(2, unit=Rate.MINUTES))
    def watchdog(event):
        return None

    clock = ManualClock(start=1_700_000_000)
    jobs = {job.name: job for job in app_jobs(app, {"RECLAIM": 1.0}, "eu-west-1", clock)}
    assert {name: job.period_s for name, job in jobs.items()} == {"reclaim": 1.0, "watchdog": 120.0}
    jobs["reclaim"].run()
    event = seen[0]
    assert (event.detail_type, event.source, event.region) == ("Scheduled Event", "aws.events", "eu-west-1")
    assert event.time == "2023-11-14T22:13:20Z"
    assert event.resources == ["arn:aws:events:eu-west-1:123456789012:rule/reclaim"]


def test_an_app_without_schedules_has_no_jobs():
    assert app_jobs(Chalice(app_name="plain"), {}, "us-east-1", ManualClock()) == []


def test_scheduler_calls_at_start_keeps_calling_after_failures_and_stops_at_once():
    calls, hourly = [], threading.Event()
    done = threading.Event()

    def flaky():
        calls.append(time.monotonic())
        if len(calls) >= 3:
            done.set()
        raise RuntimeError("a failed run is retried next period")

    scheduler = Scheduler([Job("flaky", 0.02, flaky), Job("hourly", 3600, hourly.set)])
    scheduler.start()
    try:
        assert hourly.wait(5)  # at start, not an hour later
        assert done.wait(5)
    finally:
        began = time.monotonic()
        scheduler.stop()
    assert time.monotonic() - began < 1
    assert not [t for t in threading.enumerate() if t.name.startswith("kvcm-local-schedule-")]


def test_a_job_that_does_not_return_cannot_hold_the_stop_up(caplog):
    entered, release = threading.Event(), threading.Event()

    def stuck():
        entered.set()
        release.wait(30)

    scheduler = Scheduler([Job("stuck", 3600, stuck)])
    scheduler.start()
    assert entered.wait(5)
    began = time.monotonic()
    try:
        scheduler.stop(timeout_s=0.2)
        assert time.monotonic() - began < 2
        assert "kvcm-local-schedule-stuck" in caplog.text
    finally:
        release.set()


def test_a_driven_job_runs_only_when_its_driver_calls_it_and_its_timer_resumes_after():
    calls, called, release = [], threading.Event(), threading.Event()

    def job():
        calls.append(threading.current_thread().name)
        called.set()
        release.wait(5)
        return len(calls)

    scheduler = Scheduler([Job("job", 0.01, job)])
    scheduler.start()
    try:
        assert called.wait(5)  # the timer's first call is running
        threading.Timer(0.2, release.set).start()
        began = time.monotonic()
        with scheduler.driven("job") as run:
            assert time.monotonic() - began >= 0.15  # taking the job over waited for that call
            by_timer = len(calls)
            assert run("job") == by_timer + 1 and calls[-1] == threading.current_thread().name
            with pytest.raises(RuntimeError, match="already driven"):
                scheduler.driven("job").__enter__()
            threading.Event().wait(0.1)  # ten periods of the timer
            assert len(calls) == by_timer + 1  # the timer called nothing
            called.clear()
        assert called.wait(5)  # back on its timer
        with pytest.raises(RuntimeError, match="not driven"):
            run("job")
        with pytest.raises(ValueError, match="no scheduled job named nope"):
            scheduler.driven("job", "nope").__enter__()
    finally:
        release.set()
        scheduler.stop()
