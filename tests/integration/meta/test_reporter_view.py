"""The instance's reporter view (``T:er:view``, issue 25 item 2): readers take every live
reporter's visible slots from one hash written in the same script as each change to a
reporter's state, instead of reading each reporter's state (a call per reporter: 64 hosts,
64 reads before any key). Commands counted on real Valkey, no timer."""

from __future__ import annotations

import pytest

from chalicelib.stores.reporters import (
    Liveness,
    ReporterStore,
    add_event,
    host_down_event,
    register_event,
    snapshot_event,
)

LIVE = Liveness(heartbeat_timeout_ms=1000, cleanup_grace_ms=2000, snapshot_min_interval_ms=0)
TIMEOUTS = {"l1p5": 1000}
HOSTS = [f"10.0.0.{h}:8080" for h in range(64)]


def calls(valkey, command: str) -> int:
    return int(valkey.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


@pytest.fixture
def store(valkey) -> ReporterStore:
    """64 reporters; host h holds keys 1..h+1."""
    store = ReporterStore(valkey)
    for h, host in enumerate(HOSTS):
        events = [register_event(["gpu"])]
        events += [add_event(k, "gpu", [("full_0", f"event_report://{host}/{k}")]) for k in range(1, h + 2)]
        store.report("e1", f"l1p5#{host}", events, 100, LIVE)
    return store


def reads(store: ReporterStore, now: int = 200) -> tuple[dict[str, int], list[int]]:
    prefixes = store.host_prefixes("e1", list(range(1, 70)), now, TIMEOUTS)
    holders = [len(per_key) for per_key in store.visible_locations("e1", [1, 64, 65], now, TIMEOUTS)]
    return prefixes, holders


def test_reads_take_no_reporter_state(valkey, store):
    valkey.config_resetstat()
    prefixes, holders = reads(store)
    assert prefixes == {host: h + 1 for h, host in enumerate(HOSTS)}
    assert holders == [64, 1, 0]
    # One HGETALL a read (the view's), whatever the number of reporters; no reporter set.
    assert calls(valkey, "hgetall") == 2 and calls(valkey, "smembers") == 0


def test_the_view_follows_each_change_of_a_reporter(valkey, store):
    """Host down, a snapshot (strict: the older generation hidden) and a silent reporter."""
    store.report("e1", f"l1p5#{HOSTS[63]}", [host_down_event()], 150, LIVE)
    block = (1, "gpu", [("full_0", "event_report://x/1")])
    store.report("e1", f"l1p5#{HOSTS[62]}", [snapshot_event([block])], 150, LIVE)
    prefixes, holders = reads(store)
    assert HOSTS[63] not in prefixes and prefixes[HOSTS[62]] == 1
    assert holders == [63, 0, 0]
    store.report("e1", f"l1p5#{HOSTS[0]}", [register_event(["gpu"])], 2_000, LIVE)  # the others fall silent
    assert reads(store, 2_000) == ({HOSTS[0]: 1}, [1, 0, 0])


def test_an_instance_reported_before_the_view_gets_it_at_its_first_read(valkey, store):
    before = reads(store)
    valkey.delete(store.view_key("e1"))
    assert reads(store) == before
    valkey.config_resetstat()
    assert reads(store) == before
    assert calls(valkey, "hgetall") == 2 and calls(valkey, "smembers") == 0
