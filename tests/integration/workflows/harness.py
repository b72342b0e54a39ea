"""Helpers of the workflow tests: waiting on executions (fixtures are in this directory's conftest)."""

from __future__ import annotations

import time


def wait_for(predicate, timeout_s: float, interval_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    return predicate()


def wait_execution(sfn, arn: str, timeout_s: float = 30) -> dict:
    result = wait_for(lambda: (d := sfn.describe_execution(executionArn=arn))["status"] != "RUNNING" and d, timeout_s)
    assert result, f"execution {arn} still running"
    return result
