"""TCP reachability checks for storages that are network services (Mooncake, memory pool)."""

from __future__ import annotations

import socket
from collections.abc import Sequence

from .base import StorageUnavailableError

Endpoint = tuple[str, int]


def parse_host_port(text: str) -> Endpoint:
    """``host:port`` or ``[v6]:port`` as a pair; ValueError when malformed."""
    text = text.strip()
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
    else:
        host, sep, port = text.rpartition(":")
        if ":" in host:
            raise ValueError(f"an IPv6 address needs brackets: [{host}]:{port}")
    if not sep or not host:
        raise ValueError(f"expected host:port, got {text!r}")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad port in {text!r}")
    return host, int(port)


def parse_endpoints(entry: str) -> list[Endpoint]:
    """Endpoints of a service entry: ``h:p``, or a list after a scheme such as
    ``etcd://h1:p1;h2:p2`` (``;`` or ``,`` separated). ValueError when none parses."""
    _, sep, rest = entry.partition("://")
    items = [item for item in (rest if sep else entry).replace(",", ";").split(";") if item.strip()]
    if not items:
        raise ValueError(f"no endpoint in {entry!r}")
    return [parse_host_port(item) for item in items]


def probe_tcp(storage: str, endpoints: Sequence[Endpoint], timeout_s: float) -> None:
    """Return once any endpoint accepts a TCP connection; else raise StorageUnavailableError."""
    errors: list[str] = []
    for host, port in endpoints:
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return
        except OSError as exc:
            errors.append(f"{host}:{port}: {exc.strerror or exc}")
    raise StorageUnavailableError(f"storage {storage}: no endpoint reachable ({'; '.join(errors)})")
