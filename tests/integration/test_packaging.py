"""Deployment artifacts: the merge template, ``chalice package`` + cfn-lint, IAM policies.

``chalice package`` needs a region but no credentials; for the real app it pip-installs
requirements.txt (PyPI) into the deployment zip.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from chalicelib.local import asl
from chalicelib.local.config import REPO_ROOT
from infra.merge_template import build

BIN = Path(sys.executable).parent
FIXTURES = REPO_ROOT / "tests" / "e2e" / "fixtures"
ECHO_ASL = FIXTURES / "e2e_echo.asl.json"
STAGES = ("dev", "prod")

needs_pip = pytest.mark.skipif(importlib.util.find_spec("pip") is None,
                               reason="chalice package pip-installs requirements.txt and pip is unavailable")


def package(project_dir: Path, merge_template: dict, out_dir: Path, stage: str = "dev") -> dict:
    """``chalice package --merge-template``, then cfn-lint with no errors; returns the template."""
    template_file = out_dir.parent / f"{out_dir.name}-merge.json"
    template_file.write_text(json.dumps(merge_template))
    env = {**os.environ, "AWS_DEFAULT_REGION": "us-east-1"}
    packaged = subprocess.run([str(BIN / "chalice"), "--project-dir", str(project_dir), "package",
                               "--stage", stage, "--merge-template", str(template_file), str(out_dir)],
                              env=env, capture_output=True, text=True, timeout=300)
    assert packaged.returncode == 0, packaged.stdout + packaged.stderr
    lint = subprocess.run([str(BIN / "cfn-lint"), str(out_dir / "sam.json")], capture_output=True, text=True,
                          timeout=300)
    # cfn-lint's exit code is a bit field: 2 = errors, 4 = warnings, 8 = informational.
    assert lint.returncode & 2 == 0, lint.stdout + lint.stderr
    return json.loads((out_dir / "sam.json").read_text())


def state_machines(template: dict) -> dict[str, dict]:
    return {name: resource["Properties"] for name, resource in template["Resources"].items()
            if resource.get("Type") == "AWS::StepFunctions::StateMachine"}


def test_every_workflow_substitution_is_provided_by_the_template():
    machines = state_machines(build("dev"))
    for workflow, path in asl.discover([REPO_ROOT / "workflows"]).items():
        properties = machines[f"{asl.logical_id(workflow)}StateMachine"]
        needed = asl.substitutions(path.read_text())
        assert needed <= set(properties["DefinitionSubstitutions"]), f"{path}: {needed}"
        assert properties["Definition"] == json.loads(path.read_text())


def test_control_table_matches_the_control_plane_and_the_policies():
    from chalicelib.control import table_definition

    table = build("dev")["Resources"]["ControlTable"]["Properties"]
    expected = table_definition(table["TableName"])
    assert {k: table[k] for k in expected} == expected
    assert table["TableName"] == {"Fn::Sub": "kvcm-control-${Stage}"}
    for stage in STAGES:
        policy = (REPO_ROOT / ".chalice" / f"policy-{stage}.json").read_text()
        assert f"table/kvcm-control-{stage}\"" in policy
        assert f"stateMachine:kvcm-{stage}-*" in policy


def test_stage_policies_differ_only_by_stage_name():
    dev, prod = ((REPO_ROOT / ".chalice" / f"policy-{stage}.json").read_text() for stage in STAGES)
    assert dev.replace("-dev", "-prod") == prod


def test_workflow_state_machines_package_and_lint(tmp_path: Path):
    """A small project with task functions: the generated state machines, their role and the
    exported ARN variables pass cfn-lint (which validates the ASL of a Definition object)."""
    project = tmp_path / "project"
    (project / ".chalice").mkdir(parents=True)
    for name in ("config.json", "policy-dev.json"):
        shutil.copy(REPO_ROOT / ".chalice" / name, project / ".chalice" / name)
    (project / "requirements.txt").write_text("")
    (project / "app.py").write_text(
        "from chalice import Chalice\n"
        "app = Chalice(app_name='kvcm')\n"
        "@app.lambda_function(name='e2e_echo')\n"
        "def e2e_echo(event, context):\n    return event\n"
        "@app.route('/api/checkHealth', methods=['POST'])\n"
        "def check_health():\n    return {}\n")
    workflows = tmp_path / "workflows"
    workflows.mkdir()
    shutil.copy(ECHO_ASL, workflows / ECHO_ASL.name)
    shutil.copy(ECHO_ASL, workflows / "write_session_reaper.asl.json")

    template = package(project, build("dev", workflows_dir=workflows, function_names=["e2e_echo", "api_handler"]),
                       tmp_path / "out")

    machines = state_machines(template)
    assert set(machines) == {"E2eEchoStateMachine", "WriteSessionReaperStateMachine"}
    assert machines["E2eEchoStateMachine"]["DefinitionSubstitutions"] == {
        "E2eEchoArn": {"Fn::GetAtt": ["E2eEcho", "Arn"]}}
    variables = template["Globals"]["Function"]["Environment"]["Variables"]
    assert "write_session_reaper" in json.dumps(variables["KVCM_REAPER_STATE_MACHINE_ARN"])
    invoke = template["Resources"]["StateMachineRole"]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"][-1]
    assert invoke["Resource"] == [{"Fn::GetAtt": ["E2eEcho", "Arn"]}]


@needs_pip
def test_the_app_packages_and_lints(tmp_path: Path):
    # One stage is enough: the others differ in policy file and variables, checked above.
    template = package(REPO_ROOT, build("dev"), tmp_path / "out")
    assert template["Parameters"]["Stage"]["Default"] == "dev"
    resources = template["Resources"]
    assert "ValkeyCache" in resources and "APIHandler" in resources
    functions = {name: r["Properties"] for name, r in resources.items() if r["Type"] == "AWS::Serverless::Function"}
    assert len(functions) == 9
    # every function mounts the storages' EFS when it is given, through a role allowed to
    for name, properties in functions.items():
        assert properties["FileSystemConfigs"]["Fn::If"][0] == "MountEfs", name
        role = properties["Role"]["Fn::GetAtt"][0]
        assert resources[role]["Type"] == "AWS::IAM::Role", name
        assert resources[role]["Properties"]["ManagedPolicyArns"]["Fn::If"][1] == [{"Ref": "EfsClientPolicy"}]
    # a full vCPU for the request path; room for the optimizer
    assert (functions["APIHandler"]["MemorySize"], functions["APIHandler"]["Timeout"]) == (1769, 29)
    assert (functions["OptimizerRun"]["MemorySize"], functions["OptimizerRun"]["Timeout"]) == (3008, 900)
