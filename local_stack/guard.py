"""What keeps two local stacks (or a stack and ``clean``) off the same state, and a stack
off ports that are taken: checked before anything starts, reported as ``StackStartError``
whose message names the variable to change.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

LOCK_FILE = "stack.lock"


class StackStartError(Exception):
    """The stack cannot start (or ``clean`` cannot run); the message says what to change."""


class StartCancelled(Exception):
    """A stop was requested while the stack was starting."""


class StateInUseError(StackStartError):
    """Another local stack (or ``clean``) holds the state directory."""


class PortInUseError(StackStartError):
    """A port the stack needs is taken."""

    def __init__(self, variable: str, host: str, port: int, reason: str = "in use") -> None:
        super().__init__(
            f"port {port} on {host} ({variable}) is {reason}: stop what listens there, "
            f"or set {variable} to a free port (0 picks one)"
        )
        self.variable = variable
        self.port = port


class StateLock:
    """An exclusive ``flock`` on ``<state_dir>/stack.lock``, the holder's pid written in it.

    The kernel drops the lock when the holder dies, however it dies (SIGKILL included), so
    a stale lock never blocks a restart. The descriptor is close-on-exec: the Valkey child
    must not keep the lock alive after the stack is gone.
    """

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.path = state_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self, hint: str = ", or set KVCM_STATE_DIR to another directory") -> None:
        """Take the lock or raise StateInUseError naming the holder's pid."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StateInUseError(
                f"another KVCM local stack (pid {holder}) is using the state directory {self.state_dir}: "
                f"stop it first{hint}"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (the file stays: unlinking it would let two holders lock two inodes)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def check_ports_free(addresses: Mapping[str, tuple[str, int]]) -> None:
    """Raise PortInUseError for the first ``{variable: (host, port)}`` that cannot be bound
    (port 0 = any free port, not checked) or whose port another variable also names."""
    seen: dict[int, str] = {}
    for variable, (host, port) in addresses.items():
        if not port:
            continue
        if port in seen:
            raise PortInUseError(variable, host, port, f"also {seen[port]}")
        seen[port] = variable
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe, port_of(variable, host, port):
            # The servers bind with SO_REUSEADDR too: a port in TIME_WAIT is free for them.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))


@contextmanager
def port_of(variable: str, host: str, port: int) -> Iterator[None]:
    """Turn "address in use" raised inside into PortInUseError naming ``variable``."""
    try:
        yield
    except OSError as error:
        if error.errno in (errno.EADDRINUSE, errno.EACCES):
            raise PortInUseError(
                variable, host, port, "in use" if error.errno == errno.EADDRINUSE else "not allowed"
            ) from error
        raise
