"""The real state machines in moto's interpreter, their Lambda tasks dispatched to the
app's handlers, against real Valkey and a file storage (wall clock: Wait really waits)."""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path

import pytest

from chalicelib.runtime import set_runtime
from infra import asl
from local_stack.aws import LAMBDA_RUNTIME, _dummy_zip
from local_stack.dispatch import LambdaDispatch
from local_stack.stack import load_app, task_handlers
from tests.helpers import SPECS, build_runtime, nfs_group_with_instance

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def workflow_clock():
    """The runtime's clock (None: the wall clock); a module overrides it to inject one."""
    return None


@pytest.fixture
def stack(valkey, valkey_url, aws, tmp_path, workflow_clock):
    import boto3

    app = load_app()
    handlers = task_handlers(app)
    lam, sfn, iam = boto3.client("lambda"), boto3.client("stepfunctions"), boto3.client("iam")
    role = iam.create_role(RoleName="kvcm-test", AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17"}))
    arns = {
        name: lam.create_function(
            FunctionName=name,
            Runtime=LAMBDA_RUNTIME,
            Role=role["Role"]["Arn"],
            Handler=f"app.{name}",
            Code={"ZipFile": _dummy_zip()},
        )["FunctionArn"]
        for name in handlers
    }
    values = asl.substitution_map(arns)
    # Unique names: an execution left running by an earlier test cannot reach these.
    suffix = uuid.uuid4().hex[:8]
    machines = {
        name: sfn.create_state_machine(
            name=f"{name}-{suffix}", roleArn=role["Role"]["Arn"], definition=asl.render(path.read_text(), values)
        )["stateMachineArn"]
        for name, path in asl.discover([REPO / "workflows"]).items()
    }
    runtime = build_runtime(
        valkey,
        valkey_url,
        workflow_clock,
        node_id="wf-node",
        reaper_state_machine_arn=machines["write_session_reaper"],
        delete_state_machine_arn=machines["batched_delete"],
        copy_state_machine_arn=machines["tier_copy"],
    )
    root = tmp_path / "nfs"
    root.mkdir()
    nfs_group_with_instance(runtime, root, 2, SPECS)
    with LambdaDispatch(handlers):
        yield dataclasses.make_dataclass("Stack", ["runtime", "sfn", "machines", "root"])(runtime, sfn, machines, root)
        # A looping execution's next self-restart fails once its machine is gone.
        for arn in machines.values():
            sfn.delete_state_machine(stateMachineArn=arn)
    set_runtime(None)
