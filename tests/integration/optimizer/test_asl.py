"""workflows/optimizer_sweep.asl.json: its shape, and a real execution in moto's Step
Functions interpreter with its Lambda tasks dispatched to the optimizer's task functions."""

from __future__ import annotations

import io
import json
import time
import zipfile
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from chalicelib.optimizer.tasks import report_task, run_task
from local_stack.aws import LAMBDA_RUNTIME
from tests.helpers import EVENT_LOG

REPO_ROOT = Path(__file__).resolve().parents[3]
ASL = REPO_ROOT / "workflows" / "optimizer_sweep.asl.json"


def states_of(definition):
    """Every state, nested Map processors included: name -> state."""
    found = {}
    for name, state in definition["States"].items():
        found[name] = state
        if "ItemProcessor" in state:
            found.update(states_of(state["ItemProcessor"]))
    return found


def test_asl_shape():
    definition = json.loads(ASL.read_text())
    states = states_of(definition)
    assert definition["StartAt"] == "ApplyDefaults"
    maps = [s for s in states.values() if s["Type"] == "Map"]
    assert len(maps) == 3 and all(1 <= m["MaxConcurrency"] <= 8 for m in maps)
    tasks = {name: s for name, s in states.items() if s["Type"] == "Task"}
    assert {name: s["Resource"] for name, s in tasks.items()} == {
        "ReplayGridPoint": "${OptimizerRunArn}",
        "BuildReport": "${OptimizerReportArn}",
    }
    assert definition["States"]["SweepPolicies"]["Next"] == "BuildReport"
    assert definition["States"]["SweepPolicies"]["ResultPath"] == "$.results"
    assert tasks["BuildReport"]["End"] is True


@pytest.fixture
def aws(monkeypatch):
    from moto.awslambda_simple.models import LambdaSimpleBackend

    # in-process moto: requests must not go to an endpoint another fixture exported
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(name, value)
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}, "lambda": {"use_docker": False}}):
        s3 = boto3.client("s3", region_name="us-east-1")
        handlers = {"optimizer_run": run_task, "optimizer_report": report_task}

        def invoke(self, function_name, qualifier, body, headers, response_headers):
            name = function_name.rsplit(":", 1)[-1]
            return json.dumps(handlers[name](json.loads(body), s3)).encode()

        monkeypatch.setattr(LambdaSimpleBackend, "invoke", invoke)
        yield s3


def _role():
    iam = boto3.client("iam", region_name="us-east-1")
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}
        ],
    }
    return iam.create_role(RoleName="optimizer", AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]


def _function(name, role):
    client = boto3.client("lambda", region_name="us-east-1")
    package = io.BytesIO()
    with zipfile.ZipFile(package, "w") as archive:
        archive.writestr("app.py", "def handler(event, context):\n    return event\n")
    return client.create_function(
        FunctionName=name,
        Runtime=LAMBDA_RUNTIME,
        Handler="app.handler",
        Role=role,
        Code={"ZipFile": package.getvalue()},
    )["FunctionArn"]


def test_the_state_machine_runs_a_sweep(aws):
    aws.create_bucket(Bucket="traces")
    aws.upload_file(str(EVENT_LOG), "traces", "events.log")
    definition = ASL.read_text()
    role = _role()
    definition = definition.replace("${OptimizerRunArn}", _function("optimizer_run", role))
    definition = definition.replace("${OptimizerReportArn}", _function("optimizer_report", role))
    sfn = boto3.client("stepfunctions", region_name="us-east-1")
    machine = sfn.create_state_machine(
        name="optimizer-sweep", definition=definition, roleArn="arn:aws:iam::123456789012:role/sfn"
    )
    execution = sfn.start_execution(
        stateMachineArn=machine["stateMachineArn"],
        name="sweep-1",
        input=json.dumps(
            {
                "trace": {"bucket": "traces", "key": "events.log"},
                "capacities": [10, 1000],
                "policies": ["lru", "lfu"],
                "output": {"bucket": "traces", "prefix": "out"},
            }
        ),
    )
    deadline = time.time() + 60
    while (status := sfn.describe_execution(executionArn=execution["executionArn"]))[
        "status"
    ] == "RUNNING" and time.time() < deadline:
        time.sleep(0.2)
    assert status["status"] == "SUCCEEDED", status
    output = json.loads(status["output"])
    assert output["points"] == 4 and output["report_key"] == "out/report.json"
    report = json.loads(aws.get_object(Bucket="traces", Key="out/report.json")["Body"].read())
    assert set(report["policies"]) == {"lru", "lfu"}
    assert report["policies"]["lru"]["capacities"] == [10, 1000]
