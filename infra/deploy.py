"""Deploys KVCM: the whole packaged stack, or the infrastructure stack for ``chalice deploy``.

Commands (``python -m infra.deploy <command> --help``):

- ``stack`` (``make deploy``): uploads ``out/<stage>/deployment.zip`` (with its modules
  compiled, for faster cold starts) and the packaged template to S3 (the template is over
  CloudFormation's 51,200-byte inline limit), creates or updates the stack ``kvcm-<stage>`` and prints its outputs.
- ``infra`` (``make deploy-infra``): the infrastructure stack ``kvcm-<stage>-infra``
  (``infra.merge_template.build_infra``): table, Valkey, network, state machines bound to
  the functions ``chalice deploy`` will create.
- ``configure-stage``: writes the infra stack's outputs into the Chalice stage
  (``.chalice/config.json``: environment, subnets, security group; a policy file), so
  ``chalice deploy --stage <stage>`` runs against it.

Without ``VpcId``/``SubnetIds`` the account's default VPC is used, a subnet in each of
three zones, and VPC endpoints on its route tables (the functions reach DynamoDB, S3,
Step Functions and Secrets Manager without a NAT gateway).

``--endpoint HOST:PORT`` points every call at a local AWS emulator (LocalStack, or the
moto server of ``infra.rehearsal``) through a ``localstack-client`` session.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from infra import merge_template

REPO_ROOT = merge_template.REPO_ROOT
#: CloudFormation's limit for a template passed inline (TemplateBody).
INLINE_TEMPLATE_LIMIT = 51_200
#: The Lambda runtime's Python (``python3.12``): bytecode is only added when compiled by it.
RUNTIME_PYTHON = (3, 12)
#: Zones the default network spans (the cache and the functions).
DEFAULT_ZONES = 3
CAPABILITIES = ["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM", "CAPABILITY_AUTO_EXPAND"]
#: Stack states a new deployment may start from.
_ROLLED_BACK_NEW = "ROLLBACK_COMPLETE"


class DeployError(RuntimeError):
    """A deployment step failed; the message says which and why."""


def session(region: str, endpoint: str | None = None) -> Any:
    """A boto3 session for AWS, or for the emulator at ``endpoint`` (``host:port``)."""
    if endpoint:
        from localstack_client.session import Session

        # localstack-client prefers AWS_ENDPOINT_URL to the host it is given: the
        # explicit endpoint must win.
        saved = os.environ.pop("AWS_ENDPOINT_URL", None)
        try:
            return Session(region_name=region, localstack_host=endpoint)
        finally:
            if saved is not None:
                os.environ["AWS_ENDPOINT_URL"] = saved
    import boto3

    return boto3.Session(region_name=region)


def stack_name(stage: str, infra: bool = False) -> str:
    return f"kvcm-{stage}-infra" if infra else f"kvcm-{stage}"


def parse_overrides(pairs: Iterable[str]) -> dict[str, str]:
    """``Key=Value`` arguments → a dict (values may contain ``=`` and commas)."""
    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise DeployError(f"parameter {pair!r} is not Key=Value")
        overrides[key] = value
    return overrides


def default_network(ec2: Any) -> dict[str, str]:
    """``VpcId``, ``SubnetIds`` and ``RouteTableIds`` of the account's default VPC."""
    vpcs = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"]
    if not vpcs:
        raise DeployError("no default VPC in this region: give VpcId=... SubnetIds=... (and RouteTableIds=...)")
    vpc_id = vpcs[0]["VpcId"]
    subnets = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc_id]}])["Subnets"]
    by_zone: dict[str, str] = {}
    for subnet in sorted(subnets, key=lambda s: (s["AvailabilityZone"], s["SubnetId"])):
        by_zone.setdefault(subnet["AvailabilityZone"], subnet["SubnetId"])
    tables = ec2.describe_route_tables(Filters=[{"Name": "vpc-id", "Values": [vpc_id]}])["RouteTables"]
    return {
        "VpcId": vpc_id,
        # One subnet in each of the first DEFAULT_ZONES zones, as ElastiCache picks by itself.
        "SubnetIds": ",".join(list(by_zone.values())[:DEFAULT_ZONES]),
        "RouteTableIds": ",".join(sorted(table["RouteTableId"] for table in tables)),
    }


def stack_parameters(aws: Any, stage: str, overrides: Mapping[str, str]) -> dict[str, str]:
    """The stack's parameters: ``Stage``, the default network unless one is given, ``overrides``."""
    parameters = {"Stage": stage}
    if "VpcId" not in overrides:
        parameters.update(default_network(aws.client("ec2")))
    parameters.update(overrides)
    return parameters


def upload(s3: Any, bucket: str, key: str, body: bytes) -> None:
    """Puts an artifact, encrypted at rest (SSE-S3) whatever the bucket's default."""
    s3.put_object(Bucket=bucket, Key=key, Body=body, ServerSideEncryption="AES256")


def object_url(s3: Any, bucket: str, key: str) -> str:
    """The URL CloudFormation reads a template from (path style: works for every endpoint)."""
    return f"{s3.meta.endpoint_url}/{bucket}/{key}"


def with_uploaded_code(template: dict, bucket: str, key: str) -> dict:
    """The packaged template with every function's ``CodeUri`` pointing at the uploaded zip."""
    for resource in template["Resources"].values():
        if resource["Type"] == "AWS::Serverless::Function":
            resource["Properties"]["CodeUri"] = {"Bucket": bucket, "Key": key}
    return template


def template_source(aws: Any, template: dict, bucket: str | None, key_prefix: str) -> dict[str, str]:
    """``TemplateBody`` when small enough, else ``TemplateURL`` of an upload to ``bucket``."""
    body = json.dumps(template, separators=(",", ":"))
    if bucket:
        s3 = aws.client("s3")
        key = f"{key_prefix}-{hashlib.sha256(body.encode()).hexdigest()[:16]}.template.json"
        upload(s3, bucket, key, body.encode())
        return {"TemplateURL": object_url(s3, bucket, key)}
    if len(body) > INLINE_TEMPLATE_LIMIT:
        raise DeployError(
            f"the template is {len(body)} bytes, over CloudFormation's inline limit of "
            f"{INLINE_TEMPLATE_LIMIT}: give an S3 bucket for it (BUCKET=... / --bucket)"
        )
    return {"TemplateBody": body}


def _stack_status(cloudformation: Any, name: str) -> str | None:
    try:
        return cloudformation.describe_stacks(StackName=name)["Stacks"][0]["StackStatus"]
    except cloudformation.exceptions.ClientError as exc:
        if "does not exist" in str(exc):
            return None
        raise


def _failure_reasons(cloudformation: Any, name: str) -> str:
    try:
        stack = cloudformation.describe_stacks(StackName=name)["Stacks"][0]
    except cloudformation.exceptions.ClientError as exc:
        return f"the stack is gone ({exc})"
    events = cloudformation.describe_stack_events(StackName=name)["StackEvents"]
    reasons = [
        f"{event.get('LogicalResourceId')}: {event.get('ResourceStatusReason', '')}"
        for event in events
        if event.get("ResourceStatus", "").endswith("_FAILED")
    ]
    return "; ".join([f"{stack['StackStatus']} {stack.get('StackStatusReason', '')}".strip(), *reasons[:10]])


def deploy_stack(
    aws: Any, name: str, source: Mapping[str, str], parameters: Mapping[str, str], poll_s: float = 5.0
) -> dict[str, str]:
    """Creates or updates the stack and waits for it; returns its outputs."""
    cloudformation = aws.client("cloudformation")
    status = _stack_status(cloudformation, name)
    if status == _ROLLED_BACK_NEW:  # a first creation that failed: it can only be deleted
        cloudformation.delete_stack(StackName=name)
        cloudformation.get_waiter("stack_delete_complete").wait(StackName=name, WaiterConfig={"Delay": poll_s})
        status = None
    arguments = dict(
        StackName=name,
        Capabilities=CAPABILITIES,
        Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in parameters.items()],
        **source,
    )
    try:
        if status is None:
            cloudformation.create_stack(**arguments)
            waiter = "stack_create_complete"
        else:
            cloudformation.update_stack(**arguments)
            waiter = "stack_update_complete"
        cloudformation.get_waiter(waiter).wait(StackName=name, WaiterConfig={"Delay": poll_s, "MaxAttempts": 720})
    except cloudformation.exceptions.ClientError as exc:
        if "No updates are to be performed" not in str(exc):
            raise DeployError(f"stack {name}: {exc}") from exc
    except Exception as exc:  # botocore's WaiterError: the stack failed or rolled back
        raise DeployError(f"stack {name} failed: {_failure_reasons(cloudformation, name)} ({exc})") from exc
    return stack_outputs(aws, name)


def stack_outputs(aws: Any, name: str) -> dict[str, str]:
    stack = aws.client("cloudformation").describe_stacks(StackName=name)["Stacks"][0]
    return {output["OutputKey"]: output["OutputValue"] for output in stack.get("Outputs", [])}


def with_bytecode(code: bytes) -> bytes:
    """The deployment package with every module compiled (unchecked-hash ``.pyc``, valid
    whatever the files' mtimes): Lambda's /var/task is read-only, so without them every
    cold start compiles the app and its dependencies again. Compiled by this Python, so
    only when it is the runtime's version (3.12); else the package as it is."""
    if sys.version_info[:2] != RUNTIME_PYTHON:
        return code
    import compileall
    import io
    import py_compile
    import tempfile
    import zipfile

    with tempfile.TemporaryDirectory(prefix="kvcm-package-") as tmp:
        root = Path(tmp)
        with zipfile.ZipFile(io.BytesIO(code)) as archive:
            archive.extractall(root)
            entries = archive.infolist()
        # Into the package's own __pycache__ folders, whatever PYTHONPYCACHEPREFIX says.
        prefix, sys.pycache_prefix = sys.pycache_prefix, None
        try:
            compileall.compile_dir(
                root, quiet=2, workers=1, invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH
            )
        finally:
            sys.pycache_prefix = prefix
        known = {entry.filename for entry in entries}
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            with zipfile.ZipFile(io.BytesIO(code)) as original:
                for entry in entries:  # as packaged (names, permissions)
                    archive.writestr(entry, original.read(entry))
            for path in sorted(root.rglob("*.pyc")):
                name = path.relative_to(root).as_posix()
                if name not in known:
                    archive.write(path, name)
        return buffer.getvalue()


def deploy_packaged(
    aws: Any, stage: str, bucket: str, package_dir: Path, overrides: Mapping[str, str] = {}, poll_s: float = 5.0
) -> dict[str, str]:
    """``make deploy``: the packaged template and its code, through S3, as stack ``kvcm-<stage>``."""
    template = json.loads((package_dir / "sam.json").read_text(encoding="utf-8"))
    code = with_bytecode((package_dir / "deployment.zip").read_bytes())
    code_key = f"kvcm/{stage}/deployment-{hashlib.sha256(code).hexdigest()[:16]}.zip"
    upload(aws.client("s3"), bucket, code_key, code)
    source = template_source(aws, with_uploaded_code(template, bucket, code_key), bucket, f"kvcm/{stage}/sam")
    return deploy_stack(aws, stack_name(stage), source, stack_parameters(aws, stage, overrides), poll_s)


def deploy_infra(
    aws: Any, stage: str, bucket: str | None = None, overrides: Mapping[str, str] = {}, poll_s: float = 5.0
) -> dict[str, str]:
    """The infrastructure stack ``kvcm-<stage>-infra`` for ``chalice deploy``."""
    source = template_source(aws, merge_template.build_infra(stage), bucket, f"kvcm/{stage}/infra")
    return deploy_stack(aws, stack_name(stage, infra=True), source, stack_parameters(aws, stage, overrides), poll_s)


def stage_environment(outputs: Mapping[str, str]) -> dict[str, str]:
    """The functions' environment from the infra stack's outputs."""
    from infra import asl

    variables = {variable: outputs[key] for variable, key in merge_template.FUNCTION_ENVIRONMENT_OUTPUTS.items()}
    for workflow, variable in asl.STATE_MACHINE_ENV.items():
        key = merge_template.state_machine_output(workflow)
        if key in outputs:
            variables[variable] = outputs[key]
    return variables


def configure_stage(project_dir: Path, stage: str, outputs: Mapping[str, str]) -> dict:
    """Writes the infra stack's ``outputs`` into ``stage`` of ``.chalice/config.json``.

    A new stage starts from the safe settings (auth on, debug service off) and gets a
    policy file derived from ``policy-dev.json`` for its own resource names.
    """
    chalice_dir = project_dir / ".chalice"
    config_path = chalice_dir / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    settings = config.setdefault("stages", {}).setdefault(
        stage,
        {
            "api_gateway_stage": "api",
            "autogen_policy": False,
            "environment_variables": {"KVCM_STAGE": stage, "KVCM_DEBUG_SERVICE": "false", "KVCM_AUTH": "true"},
        },
    )
    policy_file = settings.setdefault("iam_policy_file", f"policy-{stage}.json")
    settings["autogen_policy"] = False
    settings.setdefault("environment_variables", {}).update(stage_environment(outputs))
    settings["subnet_ids"] = [subnet for subnet in outputs[merge_template.SUBNETS_OUTPUT].split(",") if subnet]
    settings["security_group_ids"] = [outputs[merge_template.SECURITY_GROUP_OUTPUT]]
    config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    policy_path = chalice_dir / policy_file
    if not policy_path.exists():
        template = (chalice_dir / "policy-dev.json").read_text(encoding="utf-8")
        policy_path.write_text(
            template.replace("kvcm-control-dev", f"kvcm-control-{stage}").replace("kvcm-dev-", f"kvcm-{stage}-"),
            encoding="utf-8",
        )
    return settings


def print_outputs(outputs: Mapping[str, str]) -> None:
    width = max((len(key) for key in outputs), default=0)
    for key in sorted(outputs):
        print(f"{key:<{width}}  {outputs[key]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.deploy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--region", default=None, help="AWS region (default: the session's, else us-east-1)")
    parser.add_argument(
        "--endpoint",
        default=None,
        metavar="HOST:PORT",
        help="a local AWS emulator (LocalStack or moto on :4566) instead of AWS",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("stack", "deploy the packaged template (make deploy)"),
        ("infra", "deploy the infrastructure stack for chalice deploy"),
    ):
        command = commands.add_parser(name, help=help_text)
        command.add_argument("--stage", required=True)
        command.add_argument("--bucket", required=name == "stack", help="S3 bucket for the code and template")
        command.add_argument("parameters", nargs="*", metavar="Key=Value", help="stack parameter overrides")
    commands.choices["stack"].add_argument("--package-dir", type=Path, help="default: out/<stage>")
    configure = commands.add_parser("configure-stage", help="fill a Chalice stage from the infra stack's outputs")
    configure.add_argument("--stage", required=True)
    configure.add_argument("--project-dir", type=Path, default=REPO_ROOT)
    args = parser.parse_args(argv)

    merge_template.apply_stage_environment(args.stage)
    aws = session(args.region or _default_region(), args.endpoint)
    try:
        if args.command == "stack":
            outputs = deploy_packaged(
                aws,
                args.stage,
                args.bucket,
                args.package_dir or REPO_ROOT / "out" / args.stage,
                parse_overrides(args.parameters),
            )
        elif args.command == "infra":
            outputs = deploy_infra(aws, args.stage, args.bucket, parse_overrides(args.parameters))
        else:
            outputs = stack_outputs(aws, stack_name(args.stage, infra=True))
            configure_stage(args.project_dir, args.stage, outputs)
            print(
                f"stage {args.stage} of {args.project_dir / '.chalice' / 'config.json'} configured; "
                f"next: chalice deploy --stage {args.stage}"
            )
            return 0
    except DeployError as exc:
        print(f"deploy failed: {exc}", file=sys.stderr)
        return 1
    print_outputs(outputs)
    return 0


def _default_region() -> str:
    import boto3

    return boto3.Session().region_name or "us-east-1"


if __name__ == "__main__":
    sys.exit(main())
