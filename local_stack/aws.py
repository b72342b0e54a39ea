"""The AWS side of the local stack: a moto server and the resources the app expects in it.

moto keeps everything in memory, so every start re-creates the Lambda functions (so
that ARNs resolve) and the state machines; the control table's content is carried over
by ``control.ControlSnapshot``, S3's buckets and objects by ``s3.S3Mirror``.
"""

from __future__ import annotations

import io
import json
import logging
import threading
import time
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from infra import asl

from .guard import port_of

#: moto runs state machines and keeps Lambda in-process (no Docker) with this config.
MOTO_CONFIG = {"stepfunctions": {"execute_state_machine": True}, "lambda": {"use_docker": False}}
#: moto accepts any credentials; fixed ones keep a developer's real keys out of it.
DUMMY_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing"}
PORT_VARIABLE = "KVCM_AWS_PORT"
POLL_INTERVAL_S = 0.05
ROLE_NAME = "kvcm-local"
LAMBDA_RUNTIME = "python3.12"


def _trust_policy(*services: str) -> str:
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Principal": {"Service": list(services)}, "Action": "sts:AssumeRole"}],
        }
    )


def _dummy_zip() -> bytes:
    """A deployment package moto accepts; the code never runs (``LambdaDispatch`` does)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("app.py", "")
    return buffer.getvalue()


class LocalAws:
    """A moto server on ``127.0.0.1:port`` (0 = free port) with Step Functions execution on."""

    def __init__(self, port: int, region: str) -> None:
        self.region = region
        self._port = port
        self._server: Any | None = None
        self._thread: threading.Thread | None = None
        self._clients: dict[str, Any] = {}

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("moto is not started")
        port: int = self._server.server_address[1]
        return port

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> str:
        """Bind (a taken port fails here, naming ``KVCM_AWS_PORT``), serve on a thread, and
        return the endpoint URL. Not ``ThreadedMotoServer``: it binds on its thread and
        waits without a timeout for a bind that failed."""
        from moto.moto_api._internal.models import moto_api_backend
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
        from werkzeug.serving import make_server

        # moto logs every request (the state machines poll a lot); the app logs its own.
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        with port_of(PORT_VARIABLE, "127.0.0.1", self._port):
            self._server = make_server(
                "127.0.0.1",
                self._port,
                DomainDispatcherApplication(create_backend_app),
                threaded=True,
                request_handler=MotoRequestHandler,
            )
        # A short poll interval: shutdown waits for the next poll.
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(POLL_INTERVAL_S,), name="kvcm-local-moto", daemon=True
        )
        self._thread.start()
        # Backends live in the process, not in the server: an earlier stack of this process
        # would otherwise still be there.
        moto_api_backend.reset()
        moto_api_backend.set_config(MOTO_CONFIG)
        return self.endpoint

    def stop(self) -> None:
        """Close the stack's clients (their keep-alive connections hold server threads), then stop."""
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        if self._server is not None:
            server, self._server = self._server, None
            server.shutdown()  # serve_forever closes the socket on its way out
            if self._thread is not None:
                self._thread.join()

    def client(self, service: str) -> Any:
        """A boto3 client bound to this server, whatever the process environment says."""
        if service not in self._clients:
            import boto3

            self._clients[service] = boto3.client(
                service,
                endpoint_url=self.endpoint,
                region_name=self.region,
                aws_access_key_id=DUMMY_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                aws_secret_access_key=DUMMY_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            )
        return self._clients[service]

    def role_arn(self) -> str:
        """The one IAM role the Lambda functions and state machines are created with."""
        iam = self.client("iam")
        try:
            role = iam.get_role(RoleName=ROLE_NAME)["Role"]
        except iam.exceptions.NoSuchEntityException:
            role = iam.create_role(
                RoleName=ROLE_NAME,
                AssumeRolePolicyDocument=_trust_policy("lambda.amazonaws.com", "states.amazonaws.com"),
            )["Role"]
        return str(role["Arn"])

    def create_functions(self, names: Iterable[str]) -> dict[str, str]:
        """Create a Lambda function per name (a dummy zip); returns ``{name: ARN}``."""
        lambda_client, role, code = self.client("lambda"), self.role_arn(), _dummy_zip()
        return {
            name: lambda_client.create_function(
                FunctionName=name, Runtime=LAMBDA_RUNTIME, Role=role, Handler=f"app.{name}", Code={"ZipFile": code}
            )["FunctionArn"]
            for name in names
        }

    def stop_executions(self, state_machine_arns: Iterable[str], timeout_s: float = 10.0) -> None:
        """Abort every running execution and wait for moto's threads running them.

        A looping workflow (the reaper) would otherwise outlive the stack and keep calling
        tasks against a stopped server. Listing again catches executions started meanwhile
        by a task (a reaper hands over to a fresh execution).
        """
        from moto.stepfunctions.parser.utils import TMP_THREADS

        sfn = self.client("stepfunctions")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            running = [
                execution["executionArn"]
                for arn in state_machine_arns
                for page in sfn.get_paginator("list_executions").paginate(stateMachineArn=arn, statusFilter="RUNNING")
                for execution in page["executions"]
            ]
            for arn in running:
                sfn.stop_execution(executionArn=arn, error="LocalStackStopped")
            for thread in list(TMP_THREADS):
                thread.join(max(0.0, deadline - time.monotonic()))
            # moto only ever appends to this list.
            TMP_THREADS[:] = [thread for thread in TMP_THREADS if thread.is_alive()]
            if not running:
                return

    def create_state_machines(
        self, definitions: Mapping[str, Path], function_arns: Mapping[str, str]
    ) -> tuple[dict[str, str], dict[str, str]]:
        """Create a state machine per ASL file, placeholders filled with ``function_arns``.

        Returns ``({workflow: state machine ARN}, {workflow: why it was skipped})``: a
        workflow whose task function does not exist (yet) is left out rather than keeping
        the whole stack from starting; ``make package`` still refuses it.
        """
        sfn, role = self.client("stepfunctions"), self.role_arn()
        values = asl.substitution_map(function_arns)
        created, skipped = {}, {}
        for name, path in definitions.items():
            try:
                definition = asl.render(path.read_text(encoding="utf-8"), values, source=path.name)
            except asl.MissingSubstitution as missing:
                skipped[name] = str(missing)
                continue
            created[name] = sfn.create_state_machine(name=name, roleArn=role, definition=definition)["stateMachineArn"]
        return created, skipped
