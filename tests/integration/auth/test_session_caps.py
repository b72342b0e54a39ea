"""One caller cannot take an instance's whole write-session budget (issue 28.8): 4,096
empty starts with a 3,600 s timeout locked the owner's writes out for an hour. Starts
writing nothing open no session (test_instance_lifecycle); with auth on, each account
may hold only ``max_write_sessions_per_caller`` of the instance's sessions."""

import pytest

from chalicelib.protocol.codes import Role
from chalicelib.protocol.models import StorageConfig
from tests.integration.control.harness import code, enable_auth, group, message, nfs, post, register_request


@pytest.fixture(params=[1, 3], ids=["one shard", "three shards"])
def engines(runtime, client, request):
    """Bearers of two engine accounts scoped to g1: "owner" and "noisy"; the instance of
    one shard, or of three (each shard counts the callers of its sessions' parts)."""
    control = runtime.control
    control.add_storage(StorageConfig.model_validate(nfs("nfs1", "/tmp/kvcm-session-caps")))
    control.create_group(group("g1", "nfs1", instance_shards=request.param))
    control.register_instance(register_request("i1", "g1"))
    headers = {}
    for name in ("owner", "noisy"):
        control.add_account(name, "", Role.ROLE_USER)
        headers[name] = {"Authorization": f"Bearer {control.create_api_key(name, 86_400)[0]}"}
    enable_auth(runtime)
    runtime.reconfigure(max_write_sessions=5, max_write_sessions_per_caller=3)
    return headers


def start(client, headers, key: int) -> dict:
    body = {"instance_id": "i1", "block_keys": [key], "write_timeout_seconds": 3600}
    return post(client, "startWriteCache", body, headers=headers)[1]


def finish(client, headers, session_id: str) -> str:
    body = {"instance_id": "i1", "write_session_id": session_id, "success_blocks": {"offset": 1}}
    return code(post(client, "finishWriteCache", body, headers=headers)[1])


def test_one_account_holds_at_most_its_share_of_an_instances_sessions(engines, client):
    noisy = [start(client, engines["noisy"], key) for key in (1, 2, 3)]
    assert [code(r) for r in noisy] == ["OK"] * 3
    refused = start(client, engines["noisy"], 4)
    assert code(refused) == "REACH_MAX_ENTITY_CAPACITY" and "KVCM_MAX_WRITE_SESSIONS_PER_CALLER" in message(refused)
    # The owner still writes: the other account's sessions took only their share.
    owner = [start(client, engines["owner"], key) for key in (10, 11)]
    assert [code(r) for r in owner] == ["OK", "OK"]
    # A finished session gives its account's place back.
    assert finish(client, engines["noisy"], noisy[0]["write_session_id"]) == "OK"
    assert code(start(client, engines["noisy"], 4)) == "OK"
    # The instance-wide cap still holds: 5 open (noisy 3, owner 2).
    whole = start(client, engines["owner"], 12)
    assert code(whole) == "REACH_MAX_ENTITY_CAPACITY" and "(KVCM_MAX_WRITE_SESSIONS)" in message(whole)


def test_an_expired_session_gives_its_callers_place_back(engines, client, runtime, clock):
    opened = [start(client, engines["noisy"], key) for key in (1, 2, 3)]
    assert [code(r) for r in opened] == ["OK"] * 3
    clock.advance(3601)
    ctx = runtime.contexts("i1")
    assert [runtime.cache.fail_session(ctx, r["write_session_id"]) for r in opened] == [1, 1, 1]
    assert [code(start(client, engines["noisy"], key)) for key in (4, 5, 6)] == ["OK"] * 3


def test_the_reapers_full_sweep_repairs_an_inflated_callers_count(engines, client, runtime):
    # An older version's finishes never counted a sharded caller down: its count stuck at the cap.
    index, ctx = runtime.index, runtime.contexts("i1")
    for shard in ctx.layout.shards:
        index.client.hset(shard.key("sc"), "noisy", 3)
    assert code(start(client, engines["noisy"], 1)) == "REACH_MAX_ENTITY_CAPACITY"
    runtime.session_reaper.expire_write_sessions()  # a container's first round: a full sweep
    assert [code(start(client, engines["noisy"], key)) for key in (1, 2, 3, 4)] == ["OK"] * 3 + [
        "REACH_MAX_ENTITY_CAPACITY"
    ]


def test_without_auth_only_the_instance_cap_applies(runtime, client, control):
    control.add_storage(StorageConfig.model_validate(nfs("nfs1", "/tmp/kvcm-session-caps")))
    control.create_group(group("g1", "nfs1"))
    control.register_instance(register_request("i1", "g1"))
    runtime.reconfigure(max_write_sessions=5, max_write_sessions_per_caller=3)
    assert [code(start(client, {}, key)) for key in range(1, 7)] == ["OK"] * 5 + ["REACH_MAX_ENTITY_CAPACITY"]
