"""Builds the template ``chalice package --merge-template`` merges into its SAM output.

``infra/kvcm.yaml`` is the hand-written part. This adds what is derived from the code so
it cannot drift: the control table's key schema (``chalicelib.control.table_definition``)
and, for every ``workflows/*.asl.json``, a state machine whose ``${XxxArn}``
placeholders are the ``Fn::GetAtt`` ARNs of the functions Chalice packages (logical id =
CamelCase of the function name), the permission to invoke them, and the ARN exported to
every function as the ``KVCM_*_STATE_MACHINE_ARN`` variable the settings read.

Every function of the app also gets the storages' EFS mount and its role the mount
permission when the ``EfsAccessPointArn`` parameter is set: SAM's ``Globals`` has no
``FileSystemConfigs``, so they are added per packaged function and role.

Usage: ``python -m infra.merge_template --stage dev --output out/dev-merge-template.json``
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Iterable

import yaml

from chalicelib.control import table_definition
from chalicelib.local import asl

INFRA_DIR = Path(__file__).resolve().parent
REPO_ROOT = INFRA_DIR.parent
BASE_TEMPLATE = INFRA_DIR / "kvcm.yaml"
WORKFLOWS_DIR = REPO_ROOT / "workflows"


def state_machine_name(workflow: str) -> dict:
    """Deterministic names (``kvcm-<stage>-<workflow>``): the IAM policies match on them."""
    return {"Fn::Sub": f"kvcm-${{Stage}}-{workflow}"}


def state_machine_arn(workflow: str) -> dict:
    """Built, not ``Ref``-ed: a function's environment referencing a state machine that
    references the function would be a dependency cycle."""
    return {"Fn::Sub": "arn:${AWS::Partition}:states:${AWS::Region}:${AWS::AccountId}"
                       f":stateMachine:kvcm-${{Stage}}-{workflow}"}


def state_machine_resource(workflow: str, definition: dict, functions: Iterable[str]) -> dict:
    """The state machine of one workflow; ``functions`` are the logical ids its tasks invoke."""
    return {
        "Type": "AWS::StepFunctions::StateMachine",
        "Properties": {
            "StateMachineName": state_machine_name(workflow),
            "RoleArn": {"Fn::GetAtt": ["StateMachineRole", "Arn"]},
            # An object (not DefinitionString), so cfn-lint validates the ASL.
            "Definition": definition,
            "DefinitionSubstitutions": {asl.arn_placeholder(logical_id): {"Fn::GetAtt": [logical_id, "Arn"]}
                                        for logical_id in sorted(functions)},
        },
    }


def app_functions(app: Any) -> list[str]:
    """Names of every Lambda function ``chalice package`` makes of ``app``."""
    names = [f.name for f in app.pure_lambda_functions] + [e.name for e in app.event_sources]
    return names + (["api_handler"] if app.routes else [])


def function_logical_id(name: str) -> str:
    return "APIHandler" if name == "api_handler" else asl.logical_id(name)


def efs_mount(function_names: Iterable[str]) -> dict:
    """Resources fragments: the EFS mount on each function, the mount policy on its role
    (named ``<function>_role`` by Chalice for a stage with an ``iam_policy_file``)."""
    mount = {"Fn::If": ["MountEfs", [{"Arn": {"Ref": "EfsAccessPointArn"}, "LocalMountPath": {"Ref": "EfsMountPath"}}],
                        {"Ref": "AWS::NoValue"}]}
    policy = {"Fn::If": ["MountEfs", [{"Ref": "EfsClientPolicy"}], {"Ref": "AWS::NoValue"}]}
    resources = {}
    for name in function_names:
        resources[function_logical_id(name)] = {"Properties": {"FileSystemConfigs": mount}}
        resources[asl.logical_id(f"{name}_role")] = {"Properties": {"ManagedPolicyArns": policy}}
    return resources


def build(stage: str, workflows_dir: Path = WORKFLOWS_DIR, base: Path = BASE_TEMPLATE,
          function_names: Iterable[str] | None = None) -> dict:
    """The merge template for ``stage`` (``function_names``: the app's, by default)."""
    template: dict[str, Any] = yaml.safe_load(base.read_text(encoding="utf-8"))
    template["Parameters"]["Stage"]["Default"] = stage
    table = template["Resources"]["ControlTable"]["Properties"]
    table.update(table_definition(table["TableName"]))

    invoked: set[str] = set()
    variables = template["Globals"]["Function"]["Environment"]["Variables"]
    for workflow, path in asl.discover([workflows_dir]).items():
        text = path.read_text(encoding="utf-8")
        functions = asl.invoked_functions(text, str(path))
        invoked |= functions
        template["Resources"][f"{asl.logical_id(workflow)}StateMachine"] = state_machine_resource(
            workflow, json.loads(text), functions)
        if workflow in asl.STATE_MACHINE_ENV:
            variables[asl.STATE_MACHINE_ENV[workflow]] = state_machine_arn(workflow)
    if invoked:
        document = template["Resources"]["StateMachineRole"]["Properties"]["Policies"][0]["PolicyDocument"]
        document["Statement"].append({
            "Sid": "InvokeTaskFunctions", "Effect": "Allow", "Action": "lambda:InvokeFunction",
            "Resource": [{"Fn::GetAtt": [name, "Arn"]} for name in sorted(invoked)]})
    if function_names is None:
        from app import app

        function_names = app_functions(app)
    template["Resources"].update(efs_mount(function_names))
    return template


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage", default="dev")
    parser.add_argument("--output", type=Path, help="file to write (default: stdout)")
    args = parser.parse_args(argv)
    text = json.dumps(build(args.stage), indent=2) + "\n"
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
