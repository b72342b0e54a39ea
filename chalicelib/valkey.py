"""Valkey plumbing shared by everything that talks to Valkey (``index``, ``stores``, the
storage health store and the mempool backend in ``storage``): the client type, building the
client, turning "Valkey cannot serve now" into SERVICE_NOT_READY, and loading Lua scripts."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import AskError, ClusterError, MovedError, ReadOnlyError, RedisClusterException, TryAgainError
from redis.retry import Retry

from .protocol.errors import ServiceNotReadyError

#: What the stores are given: a plain or a cluster-mode client.
Valkey = redis.Redis | RedisCluster


class ValkeyUnavailableError(ServiceNotReadyError):
    """Valkey did not answer."""


# Valkey cannot serve now, as opposed to "the request is wrong": no connection or a
# timeout, a cluster failing over or re-sharding (a MOVED or ASK that outlived a retry: only
# ``exchange``'s callers see one, redis-py's own commands follow them), a replica answering
# a write.
_UNAVAILABLE = (redis.ConnectionError, redis.TimeoutError, ClusterError, TryAgainError, ReadOnlyError, AskError)
# Another client's script still running; redis-py prefixes a pipeline's errors.
_BUSY = re.compile(r"(^|caused error: )BUSY\b")


@contextmanager
def valkey_errors(what: str) -> Iterator[None]:
    """Turn "Valkey cannot serve now" into ValkeyUnavailableError (SERVICE_NOT_READY on the
    wire), so an outage reads as "retry later", never as an internal error."""
    try:
        yield
    except _UNAVAILABLE as exc:
        raise ValkeyUnavailableError(f"{what} unavailable: {exc}") from None
    except redis.ResponseError as exc:
        if not _BUSY.search(str(exc)):
            raise
        raise ValkeyUnavailableError(f"{what} unavailable: {exc}") from None
    except RedisClusterException as exc:
        # Raised for no reachable node, but also for a request spanning slots (a bug).
        if "cannot be connected" not in str(exc):
            raise
        raise ValkeyUnavailableError(f"{what} unavailable: {exc}") from None


def connect(
    url: str,
    *,
    cluster: bool,
    connect_timeout_s: float,
    socket_timeout_s: float,
    username: str | None = None,
    password: str | None = None,
) -> Valkey:
    """A client sized for the request path: a hung Valkey fails the call within about a
    second (SERVICE_NOT_READY). redis-py's default retries timeouts 10 times with backoff
    (10-20 s); here a dropped connection is retried once, at once, and a timeout not at all.

    Every key of an instance shares one hash tag, so each script call and each
    per-instance pipeline stays on one slot in cluster mode too."""
    credentials = {key: value for key, value in (("username", username), ("password", password)) if value}
    client_class: type[redis.Redis] | type[RedisCluster] = RedisCluster if cluster else redis.Redis
    with valkey_errors("Valkey"):  # a cluster client connects here
        client: Valkey = client_class.from_url(
            url,
            **credentials,
            socket_connect_timeout=connect_timeout_s,
            socket_timeout=socket_timeout_s,
            health_check_interval=30,
            retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
            retry_on_timeout=False,
        )
    return client


def node_pool(client: Valkey, key: bytes | str) -> redis.ConnectionPool:
    """The connection pool of the node serving ``key`` (a hash-tagged key name): for code
    that writes commands' bytes on a connection itself (``exchange``, ``Deferred``)."""
    if isinstance(client, RedisCluster):
        return client.get_redis_connection(client.get_node_from_key(key)).connection_pool
    return client.connection_pool


def _only_lines(data: bytes | bytearray, replies: int) -> bool:
    """Whether ``data`` is ``replies`` whole one-line replies (``+OK``, ``+QUEUED``, errors)."""
    lines = data.split(b"\r\n")
    return len(lines) == replies + 1 and lines[-1] == b"" and all(line[:1] in (b"+", b"-") for line in lines[:-1])


def _ends_on_error(data: bytes | bytearray) -> bool:
    """Whether ``data`` ends with a whole error line (``-...``)."""
    return data.endswith(b"\r\n") and data[data.rfind(b"\r\n", 0, len(data) - 2) + 2 :][:1] == b"-"


def exchange(client: Valkey, key: bytes | str, commands: bytes, count: int) -> bytes:
    """Send ``commands`` (several commands already in RESP, one buffer) on one connection
    of the node serving ``key``'s slot and return their replies' bytes as Valkey sent them,
    for a caller that builds a large command faster than redis-py does (no object per
    argument) and reads a large reply faster than a general reader (``resp.runs``).

    The replies' end is found by an ``ECHO`` of a random marker sent after the ``count``
    commands: the bytes read end with its reply exactly when every reply before it is whole,
    so nothing is parsed here; its reply is cut off. A server refusing every command (loading
    its data, busy with another client's script: MULTI alone is let through) answers each
    with one line, the ECHO an error too: replies that are all one line each are whole once
    there are ``count`` + 1 of them, returned as they are.

    A connection that failed (a timeout, a lost server, a reply cut short) is disconnected
    before it goes back to the pool, so that no later command reads this exchange's late
    replies; a lost connection (a pooled one the server closed) is retried
    once on a new one, as ``connect`` configures redis-py's commands."""
    marker = os.urandom(16).hex().encode()
    end = b"$32\r\n" + marker + b"\r\n"
    commands = b"".join((commands, b"*2\r\n$4\r\nECHO\r\n", end))
    pool = node_pool(client, key)
    for attempt in (1, 2):
        connection: Any = pool.get_connection()  # redis-py's connections are untyped
        try:
            connection.send_packed_command([commands])
            sock = connection._sock  # read past redis-py's reader, which holds nothing now
            data = bytearray()
            while True:
                try:
                    chunk = sock.recv(1 << 20)
                except TimeoutError:
                    raise redis.TimeoutError("Timeout reading from socket") from None
                except OSError as exc:
                    raise redis.ConnectionError(f"Error while reading from socket: {exc}") from None
                if not chunk:
                    raise redis.ConnectionError("Connection closed by server.")
                data += chunk
                if data.endswith(end):
                    return bytes(data[: -len(end)])
                # Refused, the ECHO's error is the last line: only bytes ending on an error
                # line are scanned (a long reply arriving in pieces is not, at each piece).
                if _ends_on_error(data) and data.count(b"\r\n") == count + 1 and _only_lines(data, count + 1):
                    return bytes(data)
        except redis.ConnectionError:
            connection.disconnect()
            if attempt == 2:
                raise
        except BaseException:
            connection.disconnect()
            raise
        finally:
            pool.release(connection)
    raise AssertionError("unreachable")  # the second attempt returns or raises


def follow_moved(client: Valkey, error: BaseException) -> bool:
    """After ``exchange``'s commands were answered MOVED (the slot served by another node
    now, a re-sharding): whether the cluster client's map now names that node, so that the
    commands may be sent again (once: another MOVED is SERVICE_NOT_READY)."""
    if isinstance(error, MovedError) and isinstance(client, RedisCluster):
        client.nodes_manager.move_slot(error)
        return True
    return False


class Deferred:
    """Commands sent on a connection of their own whose replies are read later (``collect``),
    for a write the caller need not wait for (a read's recency refresh: index/reads.py).
    The connection stays out of the pool until then, so no other command reads those replies."""

    def __init__(self, client: Valkey, key: bytes | str, commands: bytes, replies: int) -> None:
        self.replies = replies
        self._pool = node_pool(client, key)
        conn: Any = self._pool.get_connection()  # redis-py's connections are untyped
        self._conn = conn
        try:
            conn.send_packed_command([commands])
        except BaseException:
            self._drop()
            raise

    def collect(self) -> None:
        """Read the replies, raising the first error reply (redis-py's exception for it) or
        the connection's error; the connection goes back to the pool either way (dropped
        first if its replies were not all read)."""
        refused: redis.ResponseError | None = None
        try:
            for _ in range(self.replies):
                try:
                    self._conn.read_response()
                except redis.ResponseError as exc:  # read whole: the next reply still comes
                    refused = refused or exc
        except BaseException:
            self._drop()
            raise
        self._pool.release(self._conn)
        if refused is not None:
            raise refused

    def _drop(self) -> None:
        self._conn.disconnect()
        self._pool.release(self._conn)


def lua_source(directory: Path, name: str, prelude: str | None = None) -> str:
    """The text of ``directory/<name>.lua``, after ``directory/<prelude>.lua`` when given
    (Valkey scripts cannot include one another)."""
    body = (directory / f"{name}.lua").read_text()
    return body if prelude is None else (directory / f"{prelude}.lua").read_text() + "\n" + body


def memory_bytes(client: Valkey) -> tuple[int, int]:
    """(bytes used, ``maxmemory``) of the Valkey behind ``client``, summed over a cluster's
    primaries (0 for maxmemory when any node has no limit set)."""
    with valkey_errors("Valkey"):
        if isinstance(client, RedisCluster):
            # INFO's fields per node, as redis-py parses them: numbers and strings by field name.
            per_node = cast(dict[str, dict[str, Any]], client.info("memory", target_nodes=RedisCluster.PRIMARIES))
            nodes = list(per_node.values())
        else:
            nodes = [client.info("memory")]
    limits = [int(node.get("maxmemory", 0)) for node in nodes]
    return sum(int(node.get("used_memory", 0)) for node in nodes), sum(limits) if all(limits) else 0
