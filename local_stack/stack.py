"""``LocalStack``: every piece of the local stack, started in order and stopped in reverse."""

from __future__ import annotations

import importlib
import sys
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, ExitStack
from dataclasses import replace
from typing import Any

from chalicelib.clock import Clock, SystemClock
from chalicelib.observability.logging import logger
from chalicelib.runtime import Runtime, set_runtime
from chalicelib.settings import Settings
from infra import asl

from .aws import DUMMY_CREDENTIALS, LocalAws
from .aws import PORT_VARIABLE as AWS_PORT_VARIABLE
from .config import REPO_ROOT, StackConfig
from .control import ControlSnapshot
from .dispatch import Handler, LambdaDispatch
from .env import EnvPatch
from .guard import StartCancelled, StateLock, check_ports_free, port_of
from .s3 import S3Mirror
from .scheduler import Job, Scheduler, app_jobs
from .seed import seed_defaults
from .server import ApiServer, chalice_config
from .valkey import PORT_VARIABLE as VALKEY_PORT_VARIABLE
from .valkey import LocalValkey

API_PORT_VARIABLE = "KVCM_PORT"
#: Where moto and the embedded Valkey listen, whatever ``KVCM_HOST`` says.
LOOPBACK = "127.0.0.1"


def load_app() -> Any:
    """The Chalice app of ``app.py`` (a top-level module of the project root, as Chalice wants)."""
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    return importlib.import_module("app").app


def task_handlers(app: Any) -> dict[str, Handler]:
    """The app's ``@app.lambda_function`` handlers by function name."""
    return {function.name: app.handler_map[function.name] for function in app.pure_lambda_functions}


class LocalStack:
    """Valkey, moto (DynamoDB, Lambda, Step Functions, S3), the scheduler and the HTTP API.

    ``handlers`` are the Lambda functions created in moto and dispatched to (default: the
    app's task handlers); tests add their own. Usable as a context manager.
    """

    def __init__(
        self,
        config: StackConfig | None = None,
        app: Any = None,
        handlers: Mapping[str, Handler] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.config = config or StackConfig.from_env()
        self.app = app if app is not None else load_app()
        self.handlers: Mapping[str, Handler] = handlers if handlers is not None else task_handlers(self.app)
        self.clock = clock or SystemClock()
        self.state_lock = StateLock(self.config.state_dir)
        self.valkey = LocalValkey(self.config.valkey_dir, self.config.valkey_port, self.config.valkey_url)
        self.aws = LocalAws(self.config.aws_port, self.config.region)
        self.api = ApiServer(self.app, chalice_config(), self.config.host, self.config.port)
        self.state_machines: dict[str, str] = {}
        self.skipped_workflows: dict[str, str] = {}
        self.jobs: list[Job] = []
        #: Runs ``jobs`` (and the housekeeping), once started.
        self.scheduler: Scheduler | None = None
        self.restored_items = 0
        #: ``(buckets, objects)`` put back into moto's S3 from ``config.s3_dir``.
        self.restored_s3 = (0, 0)
        #: moto's S3 on disk, once started.
        self.s3_mirror: S3Mirror | None = None
        #: The control table on disk (snapshot + journal), once started.
        self.snapshot: ControlSnapshot | None = None
        self.seeded: list[str] = []
        self.started_in_s = 0.0
        self._exits: ExitStack | None = None
        self._stop_requested = threading.Event()
        #: Why the stack stopped on its own (its Valkey could not be kept running), if it did.
        self.failure = ""

    # ------------------------------------------------------------ lifecycle

    def start(self, stop_requested: threading.Event | None = None) -> LocalStack:
        """Start everything; on failure, stop what was started and re-raise.

        ``stop_requested`` set meanwhile (by a signal handler) ends the start at the next
        step with StartCancelled; every step is bounded in time.
        """
        if self._exits is not None:
            raise RuntimeError("the local stack is already running")
        self._stop_requested = stop_requested or threading.Event()
        began = time.perf_counter()
        exits = ExitStack()
        try:
            self._start(exits)
        except BaseException:
            exits.close()
            raise
        self._exits = exits
        self.started_in_s = time.perf_counter() - began
        return self

    def stop(self) -> None:
        """Stop everything started, in reverse order (idempotent)."""
        exits, self._exits = self._exits, None
        if exits is not None:
            exits.close()

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def _start(self, exits: ExitStack) -> None:
        # Each step registers its own undo, before doing it so that a step failing half-way
        # is undone too; ExitStack runs them in reverse on stop or failure.
        self._checkpoint()
        exits.callback(self.state_lock.release)
        self.state_lock.acquire()
        # Every port before anything starts: a taken one must not cost a half-started stack.
        check_ports_free(
            {
                API_PORT_VARIABLE: (self.config.host, self.config.port),
                AWS_PORT_VARIABLE: (LOOPBACK, self.config.aws_port),
                VALKEY_PORT_VARIABLE: (LOOPBACK, self.config.valkey_port if self.valkey.embedded else 0),
            }
        )
        env = EnvPatch()
        exits.callback(env.restore)
        # What `chalice local` would set: the stage's variables (the user's environment
        # wins), and CLI mode so Powertools Tracer stays off.
        env.set_default(chalice_config().environment_variables)
        env.set({"AWS_CHALICE_CLI_MODE": "true"})
        self._start_servers(exits, env)
        self._checkpoint()
        self._start_workflows(exits, env)
        self._checkpoint()
        runtime = Runtime(Settings.from_env(), self.clock)
        set_runtime(runtime)
        exits.callback(set_runtime, None)
        # Before the runtime goes: a running task would otherwise build a new one.
        exits.callback(self.aws.stop_executions, list(self.state_machines.values()))
        snapshot = self._start_control_plane(exits, runtime)
        self._checkpoint()

        self.jobs = app_jobs(self.app, self.config.schedule_periods, self.config.region, self.clock)
        housekeeping = (
            [Job("control-snapshot", self.config.snapshot_period_s, snapshot.compact_if_grown)]
            if self.config.snapshot_period_s > 0
            else []
        )
        self.scheduler = scheduler = Scheduler(self.jobs + housekeeping)
        exits.callback(setattr, self, "scheduler", None)
        scheduler.start()
        exits.callback(scheduler.stop)

        exits.callback(self.api.stop)
        with port_of(API_PORT_VARIABLE, self.config.host, self.config.port):
            self.api.start()
        if not runtime.settings.advertised_endpoint:  # getClusterInfo names this API as the leader's endpoint
            runtime.settings = replace(runtime.settings, advertised_endpoint=self.api_url.split("://", 1)[1])

    def driven_schedules(self, *names: str) -> AbstractContextManager[Callable[[str], Any]]:
        """The schedules ``names`` off their timers, called by the caller (``Scheduler.driven``)."""
        if self.scheduler is None:
            raise RuntimeError("the local stack is not running")
        return self.scheduler.driven(*names)

    def _valkey_lost(self, reason: str) -> None:
        """The embedded Valkey is gone for good: the stack stops (``failure`` says why)."""
        self.failure = reason
        logger.error("%s; stopping the local stack", reason)
        self._stop_requested.set()

    def _checkpoint(self) -> None:
        if self._stop_requested.is_set():
            raise StartCancelled("stop requested while starting")

    def _start_servers(self, exits: ExitStack, env: EnvPatch) -> None:
        """Valkey and moto, and the variables that point the app at them."""
        exits.callback(self.valkey.stop)
        valkey_url = self.valkey.start(cancelled=self._stop_requested.is_set)
        self.valkey.supervise(self._valkey_lost)
        self._checkpoint()
        exits.callback(self.aws.stop)
        endpoint = self.aws.start()
        # Before anything can call S3: a write now would be overwritten by the restore.
        s3_mirror = self.s3_mirror = S3Mirror(self.config.s3_dir)
        self.restored_s3 = s3_mirror.restore()
        exits.callback(s3_mirror.detach)
        s3_mirror.attach()
        # moto's Step Functions interpreter reaches the other services at localhost:$MOTO_PORT;
        # the app's boto3 clients find moto through AWS_ENDPOINT_URL.
        env.set(
            {
                "MOTO_PORT": str(self.aws.port),
                "AWS_ENDPOINT_URL": endpoint,
                **DUMMY_CREDENTIALS,
                "AWS_REGION": self.config.region,
                "AWS_DEFAULT_REGION": self.config.region,
                "KVCM_VALKEY_URL": valkey_url,
            }
        )

    def _start_workflows(self, exits: ExitStack, env: EnvPatch) -> None:
        """Lambda functions dispatched to ``handlers``; state machines; their ARNs exported."""
        exits.enter_context(LambdaDispatch(self.handlers, self.clock))
        function_arns = self.aws.create_functions(self.handlers)
        self.state_machines, self.skipped_workflows = self.aws.create_state_machines(
            asl.discover(self.config.workflow_dirs), function_arns
        )
        for reason in self.skipped_workflows.values():
            logger.warning("workflow skipped: %s", reason)
        env.set(
            {
                asl.STATE_MACHINE_ENV[name]: arn
                for name, arn in self.state_machines.items()
                if name in asl.STATE_MACHINE_ENV
            }
        )

    def _start_control_plane(self, exits: ExitStack, runtime: Runtime) -> ControlSnapshot:
        """The control table, restored from the last run's snapshot and journal, journaled
        from then on, then seeded."""
        from chalicelib.control import ensure_table

        dynamodb = self.aws.client("dynamodb")
        ensure_table(dynamodb, runtime.settings.control_table)
        snapshot = self.snapshot = ControlSnapshot(
            dynamodb, runtime.settings.control_table, self.config.control_snapshot
        )
        self.restored_items = snapshot.restore()
        exits.callback(snapshot.detach)
        snapshot.attach()
        # Saved only once restored: a failed restore must not overwrite the file with nothing.
        exits.callback(snapshot.save)
        snapshot.save()  # the journal replayed at this start is folded in
        if self.config.seed:
            self.seeded = seed_defaults(
                runtime.control, self.config.data_dir, runtime.settings.default_group_max_instances
            )
        return snapshot

    # ------------------------------------------------------------ endpoints

    @property
    def api_url(self) -> str:
        return self.api.url

    @property
    def aws_endpoint(self) -> str:
        return self.aws.endpoint

    @property
    def valkey_url(self) -> str:
        return self.valkey.url

    def banner(self) -> str:
        """What a developer needs to know once the stack is up."""
        valkey = (
            f"{self.valkey_url}  (embedded, data in {self.config.valkey_dir})"
            if self.valkey.embedded
            else f"{self.valkey_url}  (external)"
        )
        if self.valkey.stopped_leftovers:
            pids = ", ".join(map(str, self.valkey.stopped_leftovers))
            valkey += f"   (stopped the Valkey left running there: pid {pids})"
        schedules = ", ".join(f"{job.name} every {job.period_s:g} s" for job in self.jobs) or "none"
        workflows = ", ".join(self.state_machines) or "none"
        if self.skipped_workflows:
            workflows += "   SKIPPED: " + "; ".join(self.skipped_workflows.values())
        return "\n".join(
            [
                f"KVCM local stack ready in {self.started_in_s:.1f} s",
                f"  API        {self.api_url}/api/<method>   (POST JSON, e.g. {self.api_url}/api/checkHealth)",
                f"  AWS        {self.aws_endpoint}   (moto: DynamoDB, Lambda, Step Functions, S3; AWS_ENDPOINT_URL)",
                f"  Valkey     {valkey}",
                f"  State      {self.config.state_dir}   (control table: {self.restored_items} items restored, "
                f"S3: {self.restored_s3[0]} buckets, {self.restored_s3[1]} objects restored, "
                f"seeded: {', '.join(self.seeded) or 'nothing'})",
                f"  Workflows  {workflows}",
                f"  Schedules  {schedules}   (period override: KVCM_LOCAL_SCHEDULE_<NAME>_S)",
                "  Ctrl-C to stop",
            ]
        )
