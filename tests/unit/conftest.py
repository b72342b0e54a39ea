"""The unit tier does no I/O beyond its own temporary files.

While a unit test sets up, runs and tears down, opening a socket connection (connect,
connect_ex, bind, create_connection), opening a file under the shared traces directory
or spawning a process fails it: a test that needs Valkey, moto, a port, a subprocess or
a real trace belongs in ``tests/integration``. Files under ``tmp_path`` are allowed.

The guard wraps the runtest phases rather than being an autouse fixture so that it also
covers the session-scoped fixtures a unit test would set up first. It applies to the
test's own thread and to threads started during the test; threads that were already
running (a server left by an earlier integration test) are not the test's I/O.
"""

from __future__ import annotations

import builtins
import io
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import matplotlib.font_manager  # noqa: F401
import pytest

from tests.helpers import TRACES

# matplotlib.font_manager, imported above before any test runs: the first import on a machine
# without matplotlib's font cache lists the fonts with fc-list (a subprocess). That is the
# library's one-time set-up, not a test's I/O; the full suite imported it in an integration test
# first, so a unit tier run alone on a fresh machine failed the report tests.

GUARD_MESSAGE = "tests/unit does no I/O ({what}): move this test to tests/integration"


class _Guard:
    """Refuses I/O on the threads it watches; ``armed`` only during one unit test."""

    def __init__(self) -> None:
        self.armed = False
        self.test_thread = 0
        self.earlier_threads: frozenset[int] = frozenset()

    def watches_this_thread(self) -> bool:
        ident = threading.get_ident()
        return self.armed and (ident == self.test_thread or ident not in self.earlier_threads)

    def refuse(self, what: str) -> None:
        if self.watches_this_thread():
            pytest.fail(GUARD_MESSAGE.format(what=what), pytrace=True)


_guard = _Guard()
_traces_root = str(TRACES.resolve())


def _under_traces(file) -> bool:
    if isinstance(file, int):
        return False
    try:
        path = os.path.realpath(os.fsdecode(os.fspath(file)))
    except TypeError:
        return False
    return path == _traces_root or path.startswith(_traces_root + os.sep)


def _guarded(original, what: str):
    def refusing(*args, **kwargs):
        _guard.refuse(what)
        return original(*args, **kwargs)

    return refusing


def _guarded_open(original):
    def open_outside_traces(file, *args, **kwargs):
        if _under_traces(file):
            _guard.refuse(f"open() of the shared trace {file}")
        return original(file, *args, **kwargs)

    return open_outside_traces


def _patches() -> list[tuple[object, str, object]]:
    return [
        (socket.socket, "connect", _guarded(socket.socket.connect, "socket connect")),
        (socket.socket, "connect_ex", _guarded(socket.socket.connect_ex, "socket connect_ex")),
        (socket.socket, "bind", _guarded(socket.socket.bind, "socket bind")),
        (socket, "create_connection", _guarded(socket.create_connection, "socket.create_connection")),
        (builtins, "open", _guarded_open(builtins.open)),
        (io, "open", _guarded_open(io.open)),
        (subprocess.Popen, "_execute_child", _guarded(subprocess.Popen._execute_child, "a subprocess")),
        (os, "system", _guarded(os.system, "os.system")),
        (os, "posix_spawn", _guarded(os.posix_spawn, "os.posix_spawn")),
        (os, "posix_spawnp", _guarded(os.posix_spawnp, "os.posix_spawnp")),
        (os, "fork", _guarded(os.fork, "os.fork")),
    ]


@contextmanager
def _no_io() -> Iterator[None]:
    patch = pytest.MonkeyPatch()
    for target, name, value in _patches():
        patch.setattr(target, name, value)
    _guard.test_thread = threading.get_ident()
    _guard.earlier_threads = frozenset(t.ident for t in threading.enumerate() if t.ident is not None)
    _guard.armed = True
    try:
        yield
    finally:
        _guard.armed = False
        patch.undo()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _no_io():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _no_io():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    if nextitem is None:
        # The run's last test also tears down the session (the Valkey and moto servers
        # integration tests started): that I/O is not this test's.
        return (yield)
    with _no_io():
        return (yield)
