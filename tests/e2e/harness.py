"""The e2e harness: the whole local stack in this process, on free ports, state in a tmp dir.

``Api.call(method, body)`` posts to ``/api/<method>`` and returns ``(status, json)``.
The stack's clock is a ``TakeoverClock``: the wall clock, unless a test moves it itself.
Besides the app's own task handlers, the stack dispatches ``e2e_echo`` (the Lambda task of
``fixtures/e2e_echo.asl.json``), so Step Functions → Lambda is tested without touching app.py.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from local_stack import LocalStack, StackConfig
from local_stack.config import REPO_ROOT
from local_stack.stack import load_app, task_handlers

FIXTURES = Path(__file__).resolve().parent / "fixtures"
ECHO_WORKFLOW = "e2e_echo"


def e2e_echo(event: dict, context: Any) -> dict:
    """Returns what it got; raises ValueError when asked to, like a failing task."""
    if event.get("fail"):
        raise ValueError("asked to fail")
    return {"echo": event, "function": context.function_name}


class TakeoverClock:
    """The wall clock until a test takes it over (``manual``): it then moves only by
    ``advance``; given back, it follows the wall clock again from where it was left, never
    backwards (ahead of the wall clock by what the test advanced past it)."""

    def __init__(self) -> None:
        self._offset = 0.0
        self._manual: float | None = None
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._manual if self._manual is not None else time.time() + self._offset

    def sleep(self, seconds: float) -> None:
        if self._manual is None:
            time.sleep(seconds)
        else:
            self.advance(seconds)

    def advance(self, seconds: float) -> None:
        with self._lock:
            if self._manual is None:
                raise RuntimeError("the clock follows the wall clock: take it over first (manual)")
            self._manual += seconds

    @contextmanager
    def manual(self) -> Iterator[TakeoverClock]:
        """Stop the clock where it is for the block; it moves by ``advance`` only."""
        with self._lock:
            if self._manual is not None:
                raise RuntimeError("the clock is already taken over")
            self._manual = time.time() + self._offset
        try:
            yield self
        finally:
            with self._lock:
                assert self._manual is not None
                self._offset = max(self._offset, self._manual - time.time())
                self._manual = None


@dataclass(frozen=True)
class Api:
    """The stack's HTTP API."""

    url: str

    def call(
        self, method: str, body: dict | bytes | str | None = None, headers: dict | None = None, timeout_s: float = 10.0
    ) -> tuple[int, Any]:
        """POST ``body`` (a dict is sent as JSON, bytes/str as is) to ``/api/<method>``."""
        data = (
            body
            if isinstance(body, bytes)
            else (body.encode() if isinstance(body, str) else json.dumps(body or {}).encode())
        )
        request = urllib.request.Request(
            f"{self.url}/api/{method}",
            data=data,
            method="POST",
            headers={"Content-Type": "application/json", **(headers or {})},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as error:
            status, raw = error.code, error.read()
        return status, json.loads(raw) if raw else None


def e2e_config(state_dir: Path) -> StackConfig:
    """Free ports, a private state folder, the repo's workflows plus the e2e fixtures."""
    return StackConfig(
        state_dir=state_dir, port=0, aws_port=0, workflow_dirs=(REPO_ROOT / "workflows", FIXTURES), snapshot_period_s=0
    )


def e2e_stack(state_dir: Path, **overrides: Any) -> LocalStack:
    """The stack the e2e tests run (``overrides`` replace fields of ``e2e_config``)."""
    app = load_app()
    return LocalStack(
        replace(e2e_config(state_dir), **overrides),
        app=app,
        handlers={**task_handlers(app), ECHO_WORKFLOW: e2e_echo},
        clock=TakeoverClock(),
    )


def run_execution(stack: LocalStack, workflow: str, payload: dict, timeout_s: float = 20.0) -> dict:
    """Start an execution of ``workflow`` and wait for its end; returns describe_execution."""
    sfn = stack.aws.client("stepfunctions")
    # Named: unnamed executions collide in moto's executing mode.
    arn = sfn.start_execution(
        stateMachineArn=stack.state_machines[workflow], name=uuid.uuid4().hex, input=json.dumps(payload)
    )["executionArn"]
    deadline = time.monotonic() + timeout_s
    while True:
        execution = sfn.describe_execution(executionArn=arn)
        if execution["status"] != "RUNNING" or time.monotonic() > deadline:
            return execution
        time.sleep(0.05)
