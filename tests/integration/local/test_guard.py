"""The local stack's port check, on real loopback sockets."""

from __future__ import annotations

import socket

import pytest

from local_stack.guard import PortInUseError, check_ports_free


def test_a_taken_port_is_reported_with_its_variable(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(PortInUseError, match=f"port {port} .*set KVCM_AWS_PORT") as raised:
            check_ports_free({"KVCM_PORT": ("127.0.0.1", 0), "KVCM_AWS_PORT": ("127.0.0.1", port)})
    assert raised.value.variable == "KVCM_AWS_PORT"
    check_ports_free({"KVCM_AWS_PORT": ("127.0.0.1", port)})  # closed: free again


def test_two_variables_naming_one_port_are_refused():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(PortInUseError, match="also KVCM_PORT.*set KVCM_LOCAL_VALKEY_PORT"):
        check_ports_free({"KVCM_PORT": ("127.0.0.1", port), "KVCM_LOCAL_VALKEY_PORT": ("127.0.0.1", port)})
