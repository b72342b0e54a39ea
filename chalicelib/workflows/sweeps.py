"""getCapacityReport (KVCM addition): the capacity curves and recommendation of the latest
optimizer sweep (workflows/optimizer_sweep.asl.json), read from where the state machine left
them (its execution output names ``report.json`` in S3). The console plots them.

Reads no optimizer code: importing ``chalicelib.optimizer`` costs the API a third of a second.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..protocol.models import CapacityCurve, CapacityRecommendation, GetCapacityReportResponse, ListRequest

#: Successful executions looked at for the newest (one ListExecutions page).
EXECUTIONS_PAGE = 100


def latest_sweep(sfn: Any, state_machine_arn: str) -> dict[str, Any] | None:
    """describe_execution of the newest SUCCEEDED sweep, or None."""
    executions = sfn.list_executions(
        stateMachineArn=state_machine_arn, statusFilter="SUCCEEDED", maxResults=EXECUTIONS_PAGE
    )["executions"]
    if not executions:
        return None
    newest = max(executions, key=lambda e: e.get("stopDate") or e["startDate"])
    described: dict[str, Any] = sfn.describe_execution(executionArn=newest["executionArn"])
    return described


def report_response(execution: dict[str, Any], report: dict[str, Any], report_uri: str) -> GetCapacityReportResponse:
    """The answer for one sweep's ``report.json`` (see optimizer.report.build_report)."""
    recommendation = report.get("recommendation")
    stopped = execution.get("stopDate")
    return GetCapacityReportResponse(
        execution_name=execution.get("name", ""),
        finished_time_ms=int(stopped.timestamp() * 1000) if stopped is not None else 0,
        report_uri=report_uri,
        target_hit_ratio=report.get("target_hit_ratio") or 0.0,
        curves=[
            CapacityCurve(policy=policy, capacities=curve["capacities"], block_hit_ratio=curve["block_hit_ratio"])
            for policy, curve in sorted(report.get("policies", {}).items())
        ],
        recommendation=(
            CapacityRecommendation(
                policy=recommendation["policy"],
                capacity=recommendation["capacity"],
                block_hit_ratio=recommendation.get("block_hit_ratio") or 0.0,
            )
            if recommendation
            else None
        ),
    )


class CapacityReports:
    """getCapacityReport: the newest sweep's report, from Step Functions and S3."""

    def __init__(self, stepfunctions: Callable[[], Any], s3: Callable[[], Any], state_machine_arn: str) -> None:
        self.stepfunctions = stepfunctions
        self.s3 = s3
        self.state_machine_arn = state_machine_arn

    def get_capacity_report(self, request: ListRequest) -> GetCapacityReportResponse:
        """The newest successful sweep's report; an empty answer when no sweep ran (or none is configured)."""
        arn = self.state_machine_arn
        execution = latest_sweep(self.stepfunctions(), arn) if arn else None
        if execution is None:
            return GetCapacityReportResponse()
        bucket = json.loads(execution["input"])["output"]["bucket"]
        key = json.loads(execution["output"])["report_key"]
        report = json.loads(self.s3().get_object(Bucket=bucket, Key=key)["Body"].read())
        return report_response(execution, report, f"s3://{bucket}/{key}")
