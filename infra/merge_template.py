"""Builds KVCM's CloudFormation for both deploy paths from one source.

``infra/kvcm.yaml`` is the hand-written infrastructure both paths share (control table,
Valkey cache or a bring-your-own URL, network, state machine role). This adds what is
derived from the code so it cannot drift:

- the control table's key schema (``chalicelib.control.table_definition``);
- for every ``workflows/*.asl.json``, a state machine whose ``${XxxArn}`` placeholders
  are the ARNs of the app's functions, the permission to invoke them, and its ARN as an
  output (``KVCM_*_STATE_MACHINE_ARN`` for the functions);
- per function, its log group with a retention; alarms for what an operator must know
  (API 5xx, throttles, reaper / reclaim / deletion failures, Valkey memory and compute)
  and a dashboard.

Two builds:

- ``build`` — the template ``chalice package --merge-template`` merges into its SAM
  output (``make package`` / ``make deploy``): functions are bound by logical id, the
  outputs become SAM ``Globals`` environment, ``infra/packaged.yaml`` adds the network
  and the EFS mount (per packaged function and role: SAM's ``Globals`` has no
  ``FileSystemConfigs``).
- ``build_infra`` — the stack ``chalice deploy`` runs against: functions are bound by
  Chalice's predictable names (``<app>-<stage>-<function>``); the outputs are what
  ``python -m infra.deploy configure-stage`` writes into ``.chalice/config.json``.

Usage: ``python -m infra.merge_template --stage dev [--infra] --output FILE``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from chalicelib.control import table_definition
from chalicelib.workflows.migrations import COPY_SESSION_TTL_S
from infra import asl

INFRA_DIR = Path(__file__).resolve().parent
REPO_ROOT = INFRA_DIR.parent
BASE_TEMPLATE = INFRA_DIR / "kvcm.yaml"
PACKAGED_TEMPLATE = INFRA_DIR / "packaged.yaml"
WORKFLOWS_DIR = REPO_ROOT / "workflows"
CHALICE_CONFIG = REPO_ROOT / ".chalice" / "config.json"
APP_NAME = "kvcm"

#: Function environment variable → the output of kvcm.yaml that holds its value.
FUNCTION_ENVIRONMENT_OUTPUTS: Mapping[str, str] = {
    "KVCM_VALKEY_URL": "ValkeyUrl",
    "KVCM_VALKEY_CLUSTER": "ValkeyCluster",
    "KVCM_VALKEY_SECRET_ARN": "ValkeySecretArn",
    "KVCM_CONTROL_TABLE": "ControlTableName",
}
#: Outputs holding the functions' network (``configure-stage`` reads them).
SECURITY_GROUP_OUTPUT = "FunctionSecurityGroupId"
SUBNETS_OUTPUT = "FunctionSubnetIds"


def state_machine_output(workflow: str) -> str:
    return f"{asl.logical_id(workflow)}StateMachineArn"


def state_machine_name(workflow: str) -> dict:
    """Deterministic names (``kvcm-<stage>-<workflow>``): the IAM policies match on them."""
    return {"Fn::Sub": f"kvcm-${{Stage}}-{workflow}"}


def state_machine_arn(workflow: str) -> dict:
    """Built, not ``Ref``-ed: a function's environment referencing a state machine that
    references the function would be a dependency cycle."""
    return {
        "Fn::Sub": "arn:${AWS::Partition}:states:${AWS::Region}:${AWS::AccountId}"
        f":stateMachine:kvcm-${{Stage}}-{workflow}"
    }


class PackagedFunctions:
    """Functions as ``chalice package`` emits them: resources named by logical id."""

    def arn(self, name: str) -> dict:
        return {"Fn::GetAtt": [function_logical_id(name), "Arn"]}

    def name(self, name: str) -> dict:
        return {"Ref": function_logical_id(name)}

    #: ``make package`` names the REST API after the stage (see ``build``).
    api_name = {"Fn::Sub": "kvcm-${Stage}"}


PACKAGED_FUNCTIONS = PackagedFunctions()


def deployed_function_name(name: str) -> str:
    """The name ``chalice deploy`` gives a function (``Fn::Sub`` text): ``<app>-<stage>-<function>``,
    the API handler plain ``<app>-<stage>``."""
    return f"{APP_NAME}-${{Stage}}" if name == "api_handler" else f"{APP_NAME}-${{Stage}}-{name}"


class DeployedFunctions:
    """Functions as ``chalice deploy`` creates them (``deployed_function_name``)."""

    def arn(self, name: str) -> dict:
        return {
            "Fn::Sub": "arn:${AWS::Partition}:lambda:${AWS::Region}:${AWS::AccountId}"
            f":function:{deployed_function_name(name)}"
        }

    def name(self, name: str) -> dict:
        return {"Fn::Sub": deployed_function_name(name)}

    #: ``chalice deploy`` names the REST API after the app (the swagger title).
    api_name = APP_NAME


def state_machine_resource(
    workflow: str, definition: dict, functions: Iterable[str], binding: Any = PACKAGED_FUNCTIONS
) -> dict:
    """The state machine of one workflow; ``functions`` are the function names its tasks invoke."""
    return {
        "Type": "AWS::StepFunctions::StateMachine",
        "Properties": {
            "StateMachineName": state_machine_name(workflow),
            "RoleArn": {"Fn::GetAtt": ["StateMachineRole", "Arn"]},
            # An object (not DefinitionString), so cfn-lint validates the ASL.
            "Definition": definition,
            "DefinitionSubstitutions": {
                asl.arn_placeholder(function_logical_id(name)): binding.arn(name) for name in sorted(functions)
            },
        },
    }


def app_functions(app: Any) -> list[str]:
    """Names of every Lambda function ``chalice package`` makes of ``app``."""
    names = [f.name for f in app.pure_lambda_functions] + [e.name for e in app.event_sources]
    names += [a.name for a in app.builtin_auth_handlers]  # the API Gateway authorizer, when deployed
    return names + (["api_handler"] if app.routes else [])


def function_logical_id(name: str) -> str:
    return "APIHandler" if name == "api_handler" else asl.logical_id(name)


def log_group_logical_id(name: str) -> str:
    return f"{function_logical_id(name)}LogGroup"


def log_groups(function_names: Iterable[str]) -> dict:
    """One log group per function, named as Lambda names a ``chalice deploy`` function's
    (``/aws/lambda/<function name>``) so both paths log to the same place, with the stack's
    retention."""
    return {
        log_group_logical_id(name): {
            "Type": "AWS::Logs::LogGroup",
            "DeletionPolicy": "Delete",
            "UpdateReplacePolicy": "Delete",
            "Properties": {
                "LogGroupName": {"Fn::Sub": f"/aws/lambda/{deployed_function_name(name)}"},
                "RetentionInDays": {"Ref": "LogRetentionDays"},
            },
        }
        for name in function_names
    }


#: The alarms notify the AlarmTopicArn parameter's topic when one is given.
ALARM_ACTIONS = {"Fn::If": ["HasAlarmTopic", [{"Ref": "AlarmTopicArn"}], {"Ref": "AWS::NoValue"}]}


def alarm(
    description: str,
    namespace: str,
    metric: str,
    dimensions: Mapping[str, Any],
    threshold: float,
    statistic: str = "Sum",
    periods: int = 1,
    condition: str | None = None,
    below: bool = False,
) -> dict:
    """A CloudWatch alarm on one metric over 5-minute periods: above ``threshold``, missing
    data fine; or, ``below``, under it with missing data breaching (something stopped)."""
    resource: dict[str, Any] = {
        "Type": "AWS::CloudWatch::Alarm",
        "Properties": {
            "AlarmDescription": description,
            "Namespace": namespace,
            "MetricName": metric,
            "Dimensions": [{"Name": key, "Value": value} for key, value in dimensions.items()],
            "Statistic": statistic,
            "Period": 300,
            "EvaluationPeriods": periods,
            "Threshold": threshold,
            "ComparisonOperator": "LessThanThreshold" if below else "GreaterThanThreshold",
            "TreatMissingData": "breaching" if below else "notBreaching",
            "AlarmActions": ALARM_ACTIONS,
        },
    }
    if condition:
        resource["Condition"] = condition
    return resource


def alarms(binding: Any, api_stage: str, function_names: Iterable[str]) -> dict:
    """The few alarms an operator must act on (thresholds: see docs/deploy.md)."""
    names = set(function_names)
    fn = binding.name
    resources = {
        "ApiServerErrorsAlarm": alarm(
            "More than 1% of API calls answered 5xx for 10 minutes (Valkey or DynamoDB unreachable, handler crash)",
            "AWS/ApiGateway",
            "5XXError",
            {"ApiName": binding.api_name, "Stage": api_stage},
            0.01,
            statistic="Average",
            periods=2,
        ),
        "ReaperFailuresAlarm": alarm(
            "A write-session reaper execution failed: expired write sessions are not being cleaned up",
            "AWS/States",
            "ExecutionsFailed",
            {"StateMachineArn": state_machine_arn("write_session_reaper")},
            0,
        ),
        "DeletionFailuresAlarm": alarm(
            "A batched deletion execution failed: removed blocks' data stays on storage until handed over again",
            "AWS/States",
            "ExecutionsFailed",
            {"StateMachineArn": state_machine_arn("batched_delete")},
            0,
        ),
        "TierCopyFailuresAlarm": alarm(
            "A tiered Copy execution failed: its blocks were not copied, and targets it left WRITING wait for "
            "their session's expiry (the reaper) to be deleted",
            "AWS/States",
            "ExecutionsFailed",
            {"StateMachineArn": state_machine_arn("tier_copy")},
            0,
        ),
        "TierCopyTimeoutsAlarm": alarm(
            "A tiered Copy execution ran past its TimeoutSeconds (longer than its batches take one at a time, "
            "every step retried to the end): it was stuck and Step Functions stopped it; the targets it left "
            "WRITING are deleted when their sessions expire",
            "AWS/States",
            "ExecutionsTimedOut",
            {"StateMachineArn": state_machine_arn("tier_copy")},
            0,
        ),
        "ValkeyMemoryAlarm": {
            "Type": "AWS::CloudWatch::Alarm",
            "Condition": "CreateValkey",
            "Properties": {
                "AlarmDescription": "Valkey data above 80% of ValkeyMaxDataGB: writes will be refused at the limit",
                "Metrics": [
                    {
                        "Id": "used",
                        "ReturnData": False,
                        "MetricStat": {
                            "Stat": "Maximum",
                            "Period": 300,
                            "Metric": {
                                "Namespace": "AWS/ElastiCache",
                                "MetricName": "BytesUsedForCache",
                                "Dimensions": [{"Name": "clusterId", "Value": {"Fn::Sub": "kvcm-${Stage}"}}],
                            },
                        },
                    },
                    {
                        "Id": "percent",
                        "Label": "Valkey data, % of the limit",
                        "Expression": {"Fn::Sub": "100 * used / (${ValkeyMaxDataGB} * 1073741824)"},
                    },
                ],
                "EvaluationPeriods": 1,
                "Threshold": 80,
                "ComparisonOperator": "GreaterThanThreshold",
                "TreatMissingData": "notBreaching",
                "AlarmActions": ALARM_ACTIONS,
            },
        },
        # Serverless Valkey has no CPU metric: it scales compute (ECPUs) and throttles
        # commands when load grows faster than it scales.
        "ValkeyComputeAlarm": alarm(
            "Valkey throttled commands (compute scaling behind the load): API calls slow down or fail",
            "AWS/ElastiCache",
            "ThrottledCmds",
            {"clusterId": {"Fn::Sub": "kvcm-${Stage}"}},
            0,
            condition="CreateValkey",
        ),
    }
    if "api_handler" in names:
        resources["ApiThrottlesAlarm"] = alarm(
            "The API function was throttled (account or reserved concurrency exhausted): callers get 5xx",
            "AWS/Lambda",
            "Throttles",
            {"FunctionName": fn("api_handler")},
            0,
        )
    # The service's own metrics (observability.emf, namespace KVCM/<stage>): rounds that
    # stop, deletions and purges that fail, writes that engines never finish.
    jobs = {"Fn::Sub": "KVCM/${Stage}"}
    for name, what in (("reclaim", "Reclaim"), ("health_check", "HealthCheck")):
        if name in names:
            resources[f"{what}RoundsStoppedAlarm"] = alarm(
                f"No {name} round succeeded for 15 minutes: "
                + ("groups over their watermark are not reclaimed" if name == "reclaim" else "storage health is stale"),
                jobs,
                "JobSuccesses",
                {"Job": name},
                1,
                periods=3,
                below=True,
            )
    for name, what in (("delete_batch", "DeleteBatch"), ("purge_step", "PurgeStep")):
        if name in names:
            resources[f"{what}FailuresAlarm"] = alarm(
                f"{name} failed in 3 consecutive 5-minute periods (the state machine retries; data stays on storage)",
                jobs,
                "JobFailures",
                {"Job": name},
                0,
                periods=3,
            )
    resources["ExpiredWriteSessionsAlarm"] = alarm(
        "Write sessions expired in 3 consecutive 5-minute periods: engines start writes they never finish "
        "(crashed, or write_timeout_seconds too short); their blocks are written again",
        jobs,
        "ExpiredWriteSessions",
        {"Service": "kvcm"},
        0,
        periods=3,
    )
    resources["TierCopyStuckAlarm"] = alarm(
        f"A tiered Copy batch was not finished {COPY_SESSION_TTL_S} s (COPY_SESSION_TTL_S) after its begin, "
        "longer than every retry of its steps allows: its execution died or is stuck; the reaper failed its "
        "targets, which go to deletion",
        jobs,
        "ExpiredCopySessions",
        {"Service": "kvcm"},
        0,
    )
    for name, what in (("reclaim", "Reclaim"), ("reaper_watchdog", "ReaperWatchdog")):
        if name in names:
            resources[f"{what}ErrorsAlarm"] = alarm(
                f"The {name} function failed in 3 consecutive 5-minute periods",
                "AWS/Lambda",
                "Errors",
                {"FunctionName": fn(name)},
                0,
                periods=3,
            )
    return resources


def dashboard(binding: Any, api_stage: str, function_names: Iterable[str], workflows: Iterable[str]) -> dict:
    """A CloudWatch dashboard of the service's key metrics."""
    names = sorted(function_names)
    variables: dict[str, Any] = {"ApiName": binding.api_name}
    for name in names:
        variables[f"Fn{function_logical_id(name)}"] = binding.name(name)

    def fn(name: str) -> str:
        return f"${{Fn{function_logical_id(name)}}}"

    def widget(title: str, metrics: list[list], stat: str = "Sum") -> dict:
        return {
            "type": "metric",
            "width": 12,
            "height": 6,
            "properties": {
                "title": title,
                "metrics": metrics,
                "stat": stat,
                "period": 60,
                "region": "${AWS::Region}",
                "view": "timeSeries",
            },
        }

    api = ["ApiName", "${ApiName}", "Stage", api_stage]
    widgets = [
        widget(
            "API calls and errors", [["AWS/ApiGateway", metric, *api] for metric in ("Count", "5XXError", "4XXError")]
        ),
        widget(
            "API latency (p50, p99)",
            [["AWS/ApiGateway", "Latency", *api, {"stat": stat}] for stat in ("p50", "p99")],
            stat="p50",
        ),
        widget("Function errors", [["AWS/Lambda", "Errors", "FunctionName", fn(n)] for n in names]),
        widget("Function throttles", [["AWS/Lambda", "Throttles", "FunctionName", fn(n)] for n in names]),
        widget(
            "State machine failures",
            [
                [
                    "AWS/States",
                    "ExecutionsFailed",
                    "StateMachineArn",
                    "arn:${AWS::Partition}:states:${AWS::Region}:${AWS::AccountId}"
                    f":stateMachine:kvcm-${{Stage}}-{w}",
                ]
                for w in sorted(workflows)
            ],
        ),
        widget(
            "Valkey data (bytes) and compute (ECPUs)",
            [
                ["AWS/ElastiCache", "BytesUsedForCache", "clusterId", "kvcm-${Stage}", {"stat": "Maximum"}],
                ["AWS/ElastiCache", "ElastiCacheProcessingUnits", "clusterId", "kvcm-${Stage}", {"yAxis": "right"}],
                ["AWS/ElastiCache", "ThrottledCmds", "clusterId", "kvcm-${Stage}", {"yAxis": "right"}],
            ],
        ),
        widget(
            "Control table throttles", [["AWS/DynamoDB", "ThrottledRequests", "TableName", "kvcm-control-${Stage}"]]
        ),
    ]
    for number, item in enumerate(widgets):
        item["x"], item["y"] = 12 * (number % 2), 6 * (number // 2)
    body = json.dumps({"widgets": widgets})
    return {
        "Type": "AWS::CloudWatch::Dashboard",
        "Properties": {"DashboardName": {"Fn::Sub": "kvcm-${Stage}"}, "DashboardBody": {"Fn::Sub": [body, variables]}},
    }


def efs_mount(function_names: Iterable[str]) -> dict:
    """Resources fragments: the EFS mount on each function, the mount policy on its role
    (named ``<function>_role`` by Chalice for a stage with an ``iam_policy_file``)."""
    mount = {
        "Fn::If": [
            "MountEfs",
            [{"Arn": {"Ref": "EfsAccessPointArn"}, "LocalMountPath": {"Ref": "EfsMountPath"}}],
            {"Ref": "AWS::NoValue"},
        ]
    }
    policy = {"Fn::If": ["MountEfs", [{"Ref": "EfsClientPolicy"}], {"Ref": "AWS::NoValue"}]}
    resources = {}
    for name in function_names:
        resources[function_logical_id(name)] = {"Properties": {"FileSystemConfigs": mount}}
        resources[asl.logical_id(f"{name}_role")] = {"Properties": {"ManagedPolicyArns": policy}}
    return resources


#: The alias API Gateway invokes: SnapStart serves published versions only, never ``$LATEST``.
API_ALIAS = "live"


def api_routes(app: Any) -> dict[str, list[str]]:
    """The app's routes: path → HTTP methods, as keys of ``chalice package``'s swagger."""
    return {path: sorted(method.lower() for method in entries) for path, entries in app.routes.items()}


def api_snapstart(routes: Mapping[str, Iterable[str]]) -> dict:
    """Resources fragments: the API function published under an alias with SnapStart on
    (Lambda allows SnapStart only without EFS: a stack mounting EFS keeps it off), and
    every route's integration and the invoke permission on that alias (chalice writes the
    unqualified function, which SnapStart never serves)."""
    # SAM names the alias it makes <function>Alias<alias> (cfn-lint's transform resolves no
    # `APIHandler.Alias` reference inside a swagger Fn::Sub).
    alias = f"APIHandlerAlias{API_ALIAS}"
    uri = {
        "Fn::Sub": "arn:${AWS::Partition}:apigateway:${AWS::Region}:lambda:path/2015-03-31/functions/"
        f"${{{alias}}}/invocations"
    }
    paths = {
        path: {method: {"x-amazon-apigateway-integration": {"uri": uri}} for method in methods}
        for path, methods in routes.items()
    }
    snapstart = {"Fn::If": ["MountEfs", {"Ref": "AWS::NoValue"}, {"ApplyOn": "PublishedVersions"}]}
    return {
        "APIHandler": {"Properties": {"AutoPublishAlias": API_ALIAS, "SnapStart": snapstart}},
        "APIHandlerInvokePermission": {"Properties": {"FunctionName": {"Ref": alias}}},
        "RestAPI": {"Properties": {"DefinitionBody": {"paths": paths}}},
    }


def api_throttling() -> dict:
    """The RestAPI's stage throttling (every method): a service-wide bound on requests,
    whatever the callers' credentials, set by the stack's parameters."""
    return {
        "MethodSettings": [
            {
                "ResourcePath": "/*",
                "HttpMethod": "*",
                "ThrottlingRateLimit": {"Ref": "ApiThrottleRateLimit"},
                "ThrottlingBurstLimit": {"Ref": "ApiThrottleBurstLimit"},
            }
        ]
    }


def api_gateway_stage(stage: str, config: Path = CHALICE_CONFIG) -> str:
    """The API Gateway stage Chalice deploys ``stage`` to (``api`` unless configured)."""
    settings = json.loads(config.read_text(encoding="utf-8"))
    return settings.get("stages", {}).get(stage, {}).get("api_gateway_stage", settings.get("api_gateway_stage", "api"))


def apply_stage_environment(stage: str, config: Path = CHALICE_CONFIG) -> None:
    """Sets the stage's environment variables (unset ones only), as Chalice does when it
    loads the app to package or deploy it: which functions the app has may depend on them
    (the API Gateway authorizer)."""
    settings = json.loads(config.read_text(encoding="utf-8"))
    variables = {
        **settings.get("environment_variables", {}),
        **settings.get("stages", {}).get(stage, {}).get("environment_variables", {}),
    }
    for key, value in variables.items():
        os.environ.setdefault(key, value)


def _shared(
    stage: str, workflows_dir: Path, base: Path, function_names: Iterable[str] | None, binding: Any
) -> tuple[dict, list[str]]:
    """kvcm.yaml with everything derived from the code, functions bound by ``binding``."""
    template: dict[str, Any] = yaml.safe_load(base.read_text(encoding="utf-8"))
    template["Parameters"]["Stage"]["Default"] = stage
    table = template["Resources"]["ControlTable"]["Properties"]
    table.update(table_definition(table["TableName"]))
    if function_names is None:
        from app import app

        function_names = app_functions(app)
    names = list(function_names)
    by_logical_id = {function_logical_id(name): name for name in names}

    invoked: set[str] = set()
    workflows = asl.discover([workflows_dir])
    for workflow, path in workflows.items():
        text = path.read_text(encoding="utf-8")
        functions = {by_logical_id.get(logical_id, logical_id) for logical_id in asl.invoked_functions(text, str(path))}
        invoked |= functions
        template["Resources"][f"{asl.logical_id(workflow)}StateMachine"] = state_machine_resource(
            workflow, json.loads(text), functions, binding
        )
        if workflow in asl.STATE_MACHINE_ENV:
            template["Outputs"][state_machine_output(workflow)] = {"Value": state_machine_arn(workflow)}
    if invoked:
        document = template["Resources"]["StateMachineRole"]["Properties"]["Policies"][0]["PolicyDocument"]
        document["Statement"].append(
            {
                "Sid": "InvokeTaskFunctions",
                "Effect": "Allow",
                "Action": "lambda:InvokeFunction",
                "Resource": [binding.arn(name) for name in sorted(invoked)],
            }
        )
    api_stage = api_gateway_stage(stage)
    template["Resources"].update(log_groups(names))
    template["Resources"].update(alarms(binding, api_stage, names))
    template["Resources"]["Dashboard"] = dashboard(binding, api_stage, names, workflows)
    return template, names


def function_environment(template: dict) -> dict:
    """Every function's environment from the template's outputs (name → value)."""
    outputs = template["Outputs"]
    variables = {variable: outputs[key]["Value"] for variable, key in FUNCTION_ENVIRONMENT_OUTPUTS.items()}
    for workflow, variable in asl.STATE_MACHINE_ENV.items():
        if state_machine_output(workflow) in outputs:
            variables[variable] = outputs[state_machine_output(workflow)]["Value"]
    return variables


def build(
    stage: str,
    workflows_dir: Path = WORKFLOWS_DIR,
    base: Path = BASE_TEMPLATE,
    function_names: Iterable[str] | None = None,
    routes: Mapping[str, Iterable[str]] | None = None,
) -> dict:
    """The merge template of ``chalice package`` for ``stage`` (``function_names`` and the
    API's ``routes``: the app's, by default)."""
    template, names = _shared(stage, workflows_dir, base, function_names, PACKAGED_FUNCTIONS)
    packaged = yaml.safe_load(PACKAGED_TEMPLATE.read_text(encoding="utf-8"))
    for section in ("Parameters", "Rules", "Conditions", "Resources"):
        template.setdefault(section, {}).update(packaged.get(section, {}))
    template["Globals"] = packaged["Globals"]
    template["Globals"]["Function"]["Environment"] = {"Variables": function_environment(template)}
    template["Resources"].update(efs_mount(names))
    for name in names:
        # The function logs into the stack's log group (created first, retention set)
        # instead of one Lambda would create on first use.
        template["Resources"][function_logical_id(name)]["Properties"]["LoggingConfig"] = {
            "LogGroup": {"Ref": log_group_logical_id(name)}
        }
    if "api_handler" in names:
        if routes is None:
            from app import app

            routes = api_routes(app)
        template["Resources"]["RestAPI"] = {"Properties": {"Name": PackagedFunctions.api_name, **api_throttling()}}
        for logical_id, fragment in api_snapstart(routes).items():
            properties = template["Resources"].setdefault(logical_id, {}).setdefault("Properties", {})
            properties.update(fragment["Properties"])
    return template


def build_infra(
    stage: str,
    workflows_dir: Path = WORKFLOWS_DIR,
    base: Path = BASE_TEMPLATE,
    function_names: Iterable[str] | None = None,
) -> dict:
    """The infrastructure stack ``chalice deploy --stage <stage>`` runs against."""
    template, _ = _shared(stage, workflows_dir, base, function_names, DeployedFunctions())
    template["Description"] = template["Description"] + " - infrastructure for chalice deploy"
    return template


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage", default="dev")
    parser.add_argument("--infra", action="store_true", help="the infrastructure stack for `chalice deploy`")
    parser.add_argument("--output", type=Path, help="file to write (default: stdout)")
    args = parser.parse_args(argv)
    apply_stage_environment(args.stage)
    text = json.dumps((build_infra if args.infra else build)(args.stage), indent=2) + "\n"
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
