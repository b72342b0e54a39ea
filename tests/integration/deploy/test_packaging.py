"""Deployment artifacts: the merge template and the infra stack, ``chalice package`` +
cfn-lint, checkov, IAM policies and the deployable stages' settings.

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

from chalicelib.workflows.migrations import EXECUTION_TIMEOUT_S
from infra import asl
from infra.merge_template import API_ALIAS, api_routes, app_functions, build, build_infra, function_logical_id
from local_stack.config import REPO_ROOT

BIN = Path(sys.executable).parent
FIXTURES = REPO_ROOT / "tests" / "e2e" / "fixtures"
ECHO_ASL = FIXTURES / "e2e_echo.asl.json"
STAGES = ("dev", "prod")
TOOLS = REPO_ROOT / ".venv-tools" / "bin"

needs_pip = pytest.mark.skipif(
    importlib.util.find_spec("pip") is None,
    reason="chalice package pip-installs requirements.txt and pip is unavailable",
)


def lint(template_file: Path) -> None:
    """cfn-lint without errors (its exit code is a bit field: 2 = errors, 4 = warnings, 8 = informational)."""
    result = subprocess.run([str(BIN / "cfn-lint"), str(template_file)], capture_output=True, text=True, timeout=300)
    assert result.returncode & 2 == 0, result.stdout + result.stderr


def package(project_dir: Path, merge_template: dict, out_dir: Path, stage: str = "dev") -> dict:
    """``chalice package --merge-template``, then cfn-lint with no errors; returns the template."""
    template_file = out_dir.parent / f"{out_dir.name}-merge.json"
    template_file.write_text(json.dumps(merge_template))
    env = {**os.environ, "AWS_DEFAULT_REGION": "us-east-1"}
    packaged = subprocess.run(
        [
            str(BIN / "chalice"),
            "--project-dir",
            str(project_dir),
            "package",
            "--stage",
            stage,
            "--merge-template",
            str(template_file),
            str(out_dir),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert packaged.returncode == 0, packaged.stdout + packaged.stderr
    lint(out_dir / "sam.json")
    return json.loads((out_dir / "sam.json").read_text())


def state_machines(template: dict) -> dict[str, dict]:
    return {
        name: resource["Properties"]
        for name, resource in template["Resources"].items()
        if resource.get("Type") == "AWS::StepFunctions::StateMachine"
    }


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
        assert f'table/kvcm-control-{stage}"' in policy
        assert f"stateMachine:kvcm-{stage}-*" in policy
        # the Valkey AUTH secret the template names kvcm-<stage>-valkey
        assert f"secret:kvcm-{stage}-*" in policy


def test_stage_policies_differ_only_by_stage_name():
    dev, prod = ((REPO_ROOT / ".chalice" / f"policy-{stage}.json").read_text() for stage in STAGES)
    assert dev.replace("-dev", "-prod") == prod


@pytest.mark.slow  # `chalice package` and cfn-lint: seconds
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
        "def check_health():\n    return {}\n"
    )
    workflows = tmp_path / "workflows"
    workflows.mkdir()
    shutil.copy(ECHO_ASL, workflows / ECHO_ASL.name)
    shutil.copy(ECHO_ASL, workflows / "write_session_reaper.asl.json")

    template = package(
        project,
        build(
            "dev",
            workflows_dir=workflows,
            function_names=["e2e_echo", "api_handler"],
            routes={"/api/checkHealth": ["post"]},
        ),
        tmp_path / "out",
    )

    machines = state_machines(template)
    assert set(machines) == {"E2eEchoStateMachine", "WriteSessionReaperStateMachine"}
    assert machines["E2eEchoStateMachine"]["DefinitionSubstitutions"] == {
        "E2eEchoArn": {"Fn::GetAtt": ["E2eEcho", "Arn"]}
    }
    variables = template["Globals"]["Function"]["Environment"]["Variables"]
    assert "write_session_reaper" in json.dumps(variables["KVCM_REAPER_STATE_MACHINE_ARN"])
    invoke = template["Resources"]["StateMachineRole"]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"][-1]
    assert invoke["Resource"] == [{"Fn::GetAtt": ["E2eEcho", "Arn"]}]


@pytest.fixture(scope="module")
def packaged_app(tmp_path_factory) -> dict:
    """The real app packaged for dev (one stage is enough: the others differ in policy file
    and variables, checked above), with its template file."""
    out = tmp_path_factory.mktemp("package") / "out"
    return {"template": package(REPO_ROOT, build("dev"), out), "file": out / "sam.json", "zip": out / "deployment.zip"}


@needs_pip
@pytest.mark.slow  # `chalice package` of the whole app: about 7 s
def test_the_app_packages_and_lints(packaged_app):
    from app import app

    template = packaged_app["template"]
    assert template["Parameters"]["Stage"]["Default"] == "dev"
    resources = template["Resources"]
    assert "ValkeyCache" in resources and "APIHandler" in resources
    functions = {name: r["Properties"] for name, r in resources.items() if r["Type"] == "AWS::Serverless::Function"}
    assert set(functions) == {function_logical_id(name) for name in app_functions(app)}
    # every function mounts the storages' EFS when it is given, through a role allowed to
    for name, properties in functions.items():
        assert properties["FileSystemConfigs"]["Fn::If"][0] == "MountEfs", name
        role = properties["Role"]["Fn::GetAtt"][0]
        assert resources[role]["Type"] == "AWS::IAM::Role", name
        assert resources[role]["Properties"]["ManagedPolicyArns"]["Fn::If"][1] == [{"Ref": "EfsClientPolicy"}]
        # ... and logs into the stack's log group, whose retention the stack sets
        group = properties["LoggingConfig"]["LogGroup"]["Ref"]
        assert resources[group]["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}, name
    # a full vCPU for the request path; room for the optimizer
    assert (functions["APIHandler"]["MemorySize"], functions["APIHandler"]["Timeout"]) == (1769, 29)
    assert (functions["OptimizerRun"]["MemorySize"], functions["OptimizerRun"]["Timeout"]) == (3008, 900)
    assert {properties["Runtime"] for properties in functions.values()} == {"python3.12"}  # SnapStart's minimum


@needs_pip
@pytest.mark.slow  # `chalice package` of the whole app: about 7 s
def test_the_api_is_served_by_snapstart_versions_unless_efs_is_mounted(packaged_app):
    """SnapStart serves published versions only: the API function publishes one under an
    alias, and every route and the invoke permission name that alias, never $LATEST."""
    from app import app

    resources = packaged_app["template"]["Resources"]
    api = resources["APIHandler"]["Properties"]
    assert api["AutoPublishAlias"] == API_ALIAS
    # Lambda refuses SnapStart on a function that mounts EFS
    assert api["SnapStart"] == {"Fn::If": ["MountEfs", {"Ref": "AWS::NoValue"}, {"ApplyOn": "PublishedVersions"}]}
    alias = f"APIHandlerAlias{API_ALIAS}"
    assert resources["APIHandlerInvokePermission"]["Properties"]["FunctionName"] == {"Ref": alias}
    paths = resources["RestAPI"]["Properties"]["DefinitionBody"]["paths"]
    integrations = {
        (path, method): operation["x-amazon-apigateway-integration"]["uri"]["Fn::Sub"]
        for path, operations in paths.items()
        for method, operation in operations.items()
        if "x-amazon-apigateway-integration" in operation
    }
    assert set(integrations) == {(path, method) for path, methods in api_routes(app).items() for method in methods}
    assert all(f"/functions/${{{alias}}}/invocations" in uri for uri in integrations.values()), integrations
    # the other functions (schedules, state-machine tasks) are not latency-bound: no SnapStart
    others = [r["Properties"] for name, r in resources.items() if name != "APIHandler" and "Function" in r["Type"]]
    assert others and not any("SnapStart" in properties for properties in others)


@needs_pip
@pytest.mark.slow  # `chalice package` of the whole app: about 7 s
def test_the_api_stage_is_throttled_service_wide(packaged_app):
    """Issue 28.1: the per-container limiters multiply with containers; the stage's
    throttling bounds every method whatever the credentials (and it passed cfn-lint)."""
    template = packaged_app["template"]
    settings = template["Resources"]["RestAPI"]["Properties"]["MethodSettings"]
    assert settings == [
        {
            "ResourcePath": "/*",
            "HttpMethod": "*",
            "ThrottlingRateLimit": {"Ref": "ApiThrottleRateLimit"},
            "ThrottlingBurstLimit": {"Ref": "ApiThrottleBurstLimit"},
        }
    ]
    parameters = template["Parameters"]
    assert parameters["ApiThrottleRateLimit"]["Default"] < parameters["ApiThrottleBurstLimit"]["Default"]


@needs_pip
@pytest.mark.slow  # `chalice package` of the whole app: about 7 s
def test_the_deployment_package_leaves_out_what_the_runtime_has(packaged_app):
    """boto3/botocore come with the Lambda runtime (16 MB of the package otherwise); the
    optimizer's plotting library is optional and stays out of every function; so does the
    local stack (local_stack/, no deployed code imports it)."""
    import zipfile

    with zipfile.ZipFile(packaged_app["zip"]) as archive:
        names = archive.namelist()
    top = {name.split("/")[0] for name in names}
    assert {"app.py", "chalicelib", "pydantic", "redis", "aws_lambda_powertools"} <= top
    assert not top & {"boto3", "botocore", "s3transfer", "matplotlib", "numpy", "local_stack", "infra"}
    assert not [name for name in names if name.startswith("chalicelib/local/")]
    assert packaged_app["zip"].stat().st_size < 8 * 1024 * 1024


def test_valkey_is_tls_with_an_auth_user_unless_brought():
    template = build("dev")
    resources, outputs = template["Resources"], template["Outputs"]
    cache = resources["ValkeyCache"]
    assert cache["Condition"] == "CreateValkey"
    assert cache["Properties"]["UserGroupId"] == {"Ref": "ValkeyUserGroup"}
    users = {
        resources[ref["Ref"]]["Properties"]["UserName"]: resources[ref["Ref"]]["Properties"]
        for ref in resources["ValkeyUserGroup"]["Properties"]["UserIds"]
    }
    assert users["default"]["AccessString"].startswith("off ")
    service = users["kvcm"]
    assert service["AccessString"].startswith("on ") and "-@dangerous" in service["AccessString"]
    assert "ValkeySecret" in json.dumps(service["AuthenticationMode"])
    created, brought = outputs["ValkeyUrl"]["Value"]["Fn::If"][1:]
    assert created["Fn::Sub"].startswith("rediss://") and brought == {"Ref": "ValkeyUrl"}
    variables = template["Globals"]["Function"]["Environment"]["Variables"]
    assert variables["KVCM_VALKEY_SECRET_ARN"] == outputs["ValkeySecretArn"]["Value"]
    assert variables["KVCM_VALKEY_URL"] == outputs["ValkeyUrl"]["Value"]


def test_alarms_and_dashboard_cover_what_an_operator_must_know():
    resources = build("dev")["Resources"]
    metrics = {
        (r["Properties"].get("Namespace"), r["Properties"].get("MetricName"))
        for r in resources.values()
        if r.get("Type") == "AWS::CloudWatch::Alarm" and isinstance(r["Properties"].get("Namespace"), str)
    }
    assert {
        ("AWS/ApiGateway", "5XXError"),
        ("AWS/Lambda", "Throttles"),
        ("AWS/States", "ExecutionsFailed"),
        ("AWS/Lambda", "Errors"),
        ("AWS/ElastiCache", "ThrottledCmds"),
    } <= metrics
    # the service's own, written as EMF lines by every job (observability.emf)
    jobs = {"Fn::Sub": "KVCM/${Stage}"}
    for alarm, metric, job in (
        ("ReclaimRoundsStoppedAlarm", "JobSuccesses", "reclaim"),
        ("HealthCheckRoundsStoppedAlarm", "JobSuccesses", "health_check"),
        ("DeleteBatchFailuresAlarm", "JobFailures", "delete_batch"),
        ("PurgeStepFailuresAlarm", "JobFailures", "purge_step"),
    ):
        props = resources[alarm]["Properties"]
        assert (props["Namespace"], props["MetricName"], props["Dimensions"]) == (
            jobs,
            metric,
            [{"Name": "Job", "Value": job}],
        )
    stopped = resources["ReclaimRoundsStoppedAlarm"]["Properties"]
    assert (stopped["ComparisonOperator"], stopped["TreatMissingData"]) == ("LessThanThreshold", "breaching")
    assert resources["ExpiredWriteSessionsAlarm"]["Properties"]["MetricName"] == "ExpiredWriteSessions"
    # A stuck tiered Copy: a batch past its session's TTL (the reaper's EMF), an execution past its timeout.
    stuck = resources["TierCopyStuckAlarm"]["Properties"]
    assert (stuck["Namespace"], stuck["MetricName"], stuck["Threshold"]) == (jobs, "ExpiredCopySessions", 0)
    timeouts = resources["TierCopyTimeoutsAlarm"]["Properties"]
    assert (timeouts["Namespace"], timeouts["MetricName"]) == ("AWS/States", "ExecutionsTimedOut")
    assert "tier_copy" in timeouts["Dimensions"][0]["Value"]["Fn::Sub"]
    (machine,) = [
        r["Properties"]
        for r in resources.values()
        if r.get("Type") == "AWS::StepFunctions::StateMachine"
        and "tier_copy" in r["Properties"]["StateMachineName"]["Fn::Sub"]
    ]
    assert machine["Definition"]["TimeoutSeconds"] == EXECUTION_TIMEOUT_S
    memory = resources["ValkeyMemoryAlarm"]["Properties"]["Metrics"]
    assert memory[0]["MetricStat"]["Metric"]["MetricName"] == "BytesUsedForCache"
    body = json.dumps(resources["Dashboard"]["Properties"]["DashboardBody"])
    for metric in ("5XXError", "Latency", "Throttles", "ExecutionsFailed", "BytesUsedForCache"):
        assert metric in body


@pytest.mark.slow  # `chalice package` and cfn-lint: seconds
def test_infra_stack_binds_state_machines_to_chalice_function_names(tmp_path: Path):
    """The stack `chalice deploy` runs against: no SAM, state machines and their role bound
    to ``kvcm-<stage>-<function>``, and every variable the functions need as an output."""
    from app import app

    template = build_infra("dev")
    assert "Globals" not in template and "Transform" not in template
    assert not any(r["Type"].startswith("AWS::Serverless") for r in template["Resources"].values())
    machines = state_machines(template)
    reaper = machines["WriteSessionReaperStateMachine"]["DefinitionSubstitutions"]
    assert reaper["ExpireWriteSessionsArn"]["Fn::Sub"].endswith(":function:kvcm-${Stage}-expire_write_sessions")
    names = set(app_functions(app))
    invoke = template["Resources"]["StateMachineRole"]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"][-1]
    for arn in invoke["Resource"]:
        assert arn["Fn::Sub"].rsplit("kvcm-${Stage}-", 1)[1] in names
    for workflow, variable in asl.STATE_MACHINE_ENV.items():
        assert f"{asl.logical_id(workflow)}StateMachineArn" in template["Outputs"], variable
    template_file = tmp_path / "infra.json"
    template_file.write_text(json.dumps(template))
    lint(template_file)


def test_deployable_stages_have_auth_on_and_fault_injection_off():
    stages = json.loads((REPO_ROOT / ".chalice" / "config.json").read_text())["stages"]
    for stage in STAGES:
        variables = stages[stage]["environment_variables"]
        assert variables["KVCM_AUTH"] == "true", stage
        assert variables["KVCM_DEBUG_SERVICE"] == "false", stage


@pytest.mark.skipif(not (TOOLS / "checkov").exists(), reason="checkov lives in .venv-tools: run `make tools`")
@needs_pip
@pytest.mark.slow  # packages the app, then checkov: about 25 s
def test_checkov_finds_nothing_beyond_the_written_waivers(packaged_app, tmp_path: Path):
    import yaml

    config = REPO_ROOT / "infra" / "checkov.yaml"
    infra = tmp_path / "infra.json"
    infra.write_text(json.dumps(build_infra("dev")))
    for template_file in (packaged_app["file"], infra):
        scan = subprocess.run(
            [str(TOOLS / "checkov"), "-f", str(template_file), "--config-file", str(config), "-o", "json"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        summary = json.loads(scan.stdout)["summary"]
        assert summary["failed"] == 0 and summary["parsing_errors"] == 0, scan.stdout[-4000:]
        assert summary["passed"] > 20
    waivers = (REPO_ROOT / "docs" / "deploy.md").read_text()
    for check in yaml.safe_load(config.read_text())["skip-check"]:
        assert f"| {check} |" in waivers, f"{check} is skipped without a waiver in docs/deploy.md"
