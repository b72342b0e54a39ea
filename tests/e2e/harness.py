"""The e2e harness: the whole local stack in this process, on free ports, state in a tmp dir.

``Api.call(method, body)`` posts to ``/api/<method>`` and returns ``(status, json)``.
Besides the app's own task handlers, the stack dispatches ``e2e_echo`` (the Lambda task of
``fixtures/e2e_echo.asl.json``), so Step Functions → Lambda is tested without touching app.py.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
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
        replace(e2e_config(state_dir), **overrides), app=app, handlers={**task_handlers(app), ECHO_WORKFLOW: e2e_echo}
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
