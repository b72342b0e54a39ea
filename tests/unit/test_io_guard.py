"""The unit tier's I/O guard (tests/unit/conftest.py) refuses what it promises to refuse."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import pytest

from tests.helpers import CONVERSATION

REFUSED = pytest.fail.Exception


def test_a_socket_connection_fails_the_test():
    with pytest.raises(REFUSED, match="tests/unit does no I/O .socket.create_connection."):
        socket.create_connection(("127.0.0.1", 9), timeout=0.1)
    with socket.socket() as sock:
        with pytest.raises(REFUSED, match="socket connect"):
            sock.connect(("127.0.0.1", 9))
        with pytest.raises(REFUSED, match="socket connect_ex"):
            sock.connect_ex(("127.0.0.1", 9))
        with pytest.raises(REFUSED, match="socket bind"):
            sock.bind(("127.0.0.1", 0))


def test_opening_a_shared_trace_fails_the_test():
    with pytest.raises(REFUSED, match="open.. of the shared trace"):
        open(CONVERSATION)
    with pytest.raises(REFUSED, match="open.. of the shared trace"):
        CONVERSATION.open()


def test_spawning_a_process_fails_the_test():
    with pytest.raises(REFUSED, match="a subprocess"):
        subprocess.run([sys.executable, "-c", "pass"], check=False)


def test_a_thread_the_test_starts_is_guarded_too():
    caught = []

    def connect():
        try:
            socket.create_connection(("127.0.0.1", 9), timeout=0.1)
        except BaseException as exc:  # noqa: BLE001 - the guard's failure is what we look for
            caught.append(exc)

    thread = threading.Thread(target=connect)
    thread.start()
    thread.join()
    assert len(caught) == 1 and isinstance(caught[0], REFUSED), caught


def test_temporary_files_are_allowed(tmp_path):
    path = tmp_path / "scratch.txt"
    with open(path, "w") as file:
        file.write("unit tests may use their own temporary files")
    assert path.read_text().startswith("unit tests")
