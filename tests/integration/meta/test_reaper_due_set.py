"""The write-session reaper reads the instances with work to do, not every instance
(issue 28.12: background cost grew with the instances; the reaper listed every instance
and read each one's sessions every 2 s). A start puts its instance in the index's due set;
a round reads only the instances due, and a full sweep every ``FULL_SWEEP_S`` repairs an
entry a dying start left out."""

from __future__ import annotations

from chalicelib.workflows.reaper import FULL_SWEEP_S
from tests.integration.meta.harness import code, register


def start(http, instance_id: str, key: int, timeout_s: int) -> str:
    resp = http(
        "startWriteCache", {"instance_id": instance_id, "block_keys": [key], "write_timeout_seconds": timeout_s}
    )
    assert code(resp) == "OK", resp
    return resp["write_session_id"]


def test_a_round_reads_only_the_instances_due(http, group, runtime, clock, monkeypatch):
    for n in range(20):
        register(http, "g1", f"idle{n}")
    register(http, "g1", "busy")
    reaper = runtime.session_reaper
    assert reaper.expire_write_sessions() == {"expired": 0, "blocks": 0}  # a container's first round: full
    start(http, "busy", 1, 10)
    later = start(http, "busy", 2, 100)
    read = []
    due_sessions = runtime.index.due_sessions
    monkeypatch.setattr(
        runtime.index, "due_sessions", lambda ids, now: read.append(list(ids)) or due_sessions(ids, now)
    )
    monkeypatch.setattr(runtime.control, "list_instances", lambda *a: (_ for _ in ()).throw(AssertionError("listed")))
    assert reaper.expire_write_sessions() == {"expired": 0, "blocks": 0}
    clock.advance(11)
    assert reaper.expire_write_sessions() == {"expired": 1, "blocks": 1}
    assert reaper.expire_write_sessions() == {"expired": 0, "blocks": 0}  # the next deadline is 89 s away
    assert read == [[], ["busy"], []]
    clock.advance(90)
    assert reaper.expire_write_sessions() == {"expired": 1, "blocks": 1}
    assert runtime.index.session(runtime.contexts("busy").layout, later) is None
    assert runtime.index.instances_due(int(clock.now() * 1000) + 10**9) == []  # nothing open: out of the set


def test_a_session_left_out_of_the_due_set_is_reaped_by_the_full_sweep(http, instance, runtime, clock, valkey):
    reaper = runtime.session_reaper
    reaper.expire_write_sessions()
    start(http, "i1", 1, 10)
    valkey.delete(runtime.index._session_due_key)  # as if the start died before adding it
    clock.advance(11)
    assert reaper.expire_write_sessions() == {"expired": 0, "blocks": 0}
    clock.advance(FULL_SWEEP_S)
    assert reaper.expire_write_sessions() == {"expired": 1, "blocks": 1}
