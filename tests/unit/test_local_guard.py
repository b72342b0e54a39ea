"""The local stack's state lock (the port check, on real sockets: tests/integration)."""

from __future__ import annotations

import os

import pytest

from local_stack.guard import StateInUseError, StateLock


def test_one_holder_per_state_directory_and_the_message_names_it(tmp_path):
    first, second = StateLock(tmp_path / "state"), StateLock(tmp_path / "state")
    first.acquire()
    try:
        with pytest.raises(StateInUseError, match=f"pid {os.getpid()}.*KVCM_STATE_DIR"):
            second.acquire()
        other = StateLock(tmp_path / "other")
        other.acquire()  # another directory is another lock
        other.release()
    finally:
        first.release()
    second.acquire()  # released: free again
    second.release()
