"""Starting Step Functions executions (named: names are unique per state machine)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from ..protocol.errors import ServiceNotReadyError

_ALPHABET = b"abcdefghijklmnopqrstuvwxyz0123456789"


def execution_name(prefix: str) -> str:
    """A unique execution name (≤ 80 characters, as Step Functions requires)."""
    return f"{prefix[:40]}-" + bytes(_ALPHABET[b % 36] for b in os.urandom(24)).decode()


def start(sfn: Any, state_machine_arn: str, name_prefix: str, payload: dict[str, Any], name: str = "") -> str:
    """Start an execution (named ``name``, else a new ``execution_name``); returns its ARN.
    Failures become ServiceNotReadyError."""
    if not state_machine_arn:
        raise ServiceNotReadyError(f"no state machine configured for {name_prefix}")
    try:
        arn: str = sfn.start_execution(
            stateMachineArn=state_machine_arn,
            name=name or execution_name(name_prefix),
            input=json.dumps(payload, separators=(",", ":")),
        )["executionArn"]
    except Exception as exc:  # noqa: BLE001 - botocore raises many types; all mean "not started"
        raise ServiceNotReadyError(f"could not start {name_prefix}: {exc}") from None
    return arn


def state_machine_of(execution_arn: str) -> str:
    """``arn:aws:states:r:a:execution:<machine>:<name>`` → the machine's ARN ("" if not one)."""
    parts = execution_arn.split(":")
    if len(parts) != 8 or parts[5] != "execution":
        return ""
    return ":".join(parts[:5] + ["stateMachine", parts[6]])


def running(sfn: Any, state_machine_arn: str) -> list[str]:
    """ARNs of the running executions of a state machine."""
    out: list[str] = []
    for page in sfn.get_paginator("list_executions").paginate(
        stateMachineArn=state_machine_arn, statusFilter="RUNNING"
    ):
        out += [e["executionArn"] for e in page["executions"]]
    return out


class StateMachine:
    """One state machine of the service, as its tasks and watchdogs see it (the Step
    Functions client is built on first use)."""

    def __init__(self, stepfunctions: Callable[[], Any], arn: str, name_prefix: str) -> None:
        self.stepfunctions = stepfunctions
        self.arn = arn
        self.name_prefix = name_prefix

    def start(self, payload: dict[str, Any], name: str = "") -> str:
        """Start an execution (named ``name``: one made beforehand with ``execution_name``,
        else a new one); returns its ARN."""
        return start(self.stepfunctions(), self.arn, self.name_prefix, payload, name)

    def continue_as_new(self, event: dict[str, Any], payload: dict[str, Any]) -> str:
        """Start the next execution of the machine running ``event``'s execution (this
        one when the event does not say)."""
        machine = state_machine_of(event.get("execution", "")) or self.arn
        return start(self.stepfunctions(), machine, self.name_prefix, payload)

    def running(self) -> list[str]:
        """ARNs of its running executions (none when no machine is configured)."""
        return running(self.stepfunctions(), self.arn) if self.arn else []
