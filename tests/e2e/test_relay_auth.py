"""The relay with auth on, end to end: vLLM's own publisher → the relay (connectors/) → the
local stack's HTTP API with auth enabled. The relay reports with an engine account's API key
(role ROLE_ENGINE, scoped to the instance's group) and its blocks show in getHostCacheState;
a relay with a revoked key or with a key scoped to another group reports nothing and says
why in its readiness."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator

import pytest
import zmq

from connectors.relay import Relay, RelayConfig
from local_stack import LocalStack
from tests.engines.loader import engines_missing_reason, load, vllm_stored_batch

from .harness import Api

pytestmark = pytest.mark.skipif(engines_missing_reason() is not None, reason=str(engines_missing_reason()))

HOST = "10.0.0.7:8080"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ok(api: Api, method: str, body: dict, bearer: str) -> dict:
    status, answer = api.call(method, body, headers={"Authorization": f"Bearer {bearer}"})
    assert status == 200 and answer["header"]["status"]["code"] == "OK", (method, answer)
    return answer


class Setup:
    """An event-report storage, a group and an instance made by the admin, and an engine
    account scoped to the group with an API key."""

    def __init__(self, api: Api, admin: str) -> None:
        suffix = uuid.uuid4().hex[:8]
        self.api, self.admin = api, admin
        self.storage, self.group, self.instance = f"er_auth_{suffix}", f"relay_auth_{suffix}", f"relay-auth-{suffix}"
        self.engine_user, self.other_user = f"engine-{suffix}", f"engine-other-{suffix}"
        event_report = {"heartbeat_timeout_ms": 600_000}
        storage = {
            "global_unique_name": self.storage,
            "storage_type": "ST_EVENT_REPORT_L1P5",
            "event_report": event_report,
        }
        self.call("addStorage", {"storage": storage})
        group = {
            "name": self.group,
            "storage_candidates": ["nfs_01"],
            "event_report_storage_candidates": [self.storage],
        }
        self.call("createInstanceGroup", {"instance_group": group})
        self.call(
            "registerInstance",
            {
                "instance_group": self.group,
                "instance_id": self.instance,
                "block_size": 16,
                "location_spec_infos": [{"name": "full_0", "size": 1024}],
                "model_deployment": {"model_name": "m", "dtype": "bf16"},
            },
        )
        self.engine_key = self.key(self.engine_user, [self.group])
        self.other_key = self.key(self.other_user, ["default"])

    def call(self, method: str, body: dict) -> dict:
        return ok(self.api, method, body, self.admin)

    def key(self, user: str, groups: list[str]) -> str:
        self.call("addAccount", {"user_name": user, "role": "ROLE_ENGINE", "instance_groups": groups})
        api_key: str = self.call("createApiKey", {"user_name": user, "expire_seconds": 3600})["api_key"]
        return api_key

    def held(self, keys: list[int]) -> dict[str, str]:
        body = {"instance_id": self.instance, "query_type": "QT_PREFIX_MATCH", "block_cache_keys": keys}
        return {h["host_ip_port"]: h["local"] for h in self.call("getHostCacheState", body)["hosts"]}

    def remove(self) -> None:
        self.call("removeInstance", {"instance_group": self.group, "instance_id": self.instance})
        for user in (self.engine_user, self.other_user):
            self.call("deleteAccount", {"user_name": user})
        self.call("removeInstanceGroup", {"name": self.group})
        self.call("removeStorage", {"storage_unique_name": self.storage})


@pytest.fixture
def made(api: Api, auth_on: str) -> Iterator[Setup]:
    setup = Setup(api, auth_on)
    yield setup
    setup.remove()


class Engine:
    """vLLM's ZmqEventPublisher on free ports."""

    def __init__(self) -> None:
        self.kv = load("vllm")
        pub, replay = free_port(), free_port()
        self.endpoint, self.replay_endpoint = f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{replay}"
        self.publisher = self.kv.ZmqEventPublisher(
            data_parallel_rank=0, endpoint=f"tcp://*:{pub}", replay_endpoint=f"tcp://*:{replay}"
        )

    def store(self, hashes: list[int]) -> None:
        self.publisher.publish(vllm_stored_batch(self.kv, hashes))


@pytest.fixture
def engine() -> Iterator[Engine]:
    running = Engine()
    yield running
    running.publisher.shutdown()


def relay_with(stack: LocalStack, engine: Engine, instance: str, token: str, context: zmq.Context) -> Relay:
    config = RelayConfig(
        manager_url=stack.api_url,
        instance_id=instance,
        host_ip_port=HOST,
        token=token,
        flush_interval_s=0.01,
        heartbeat_interval_s=0.5,
        retry_base_s=0.05,
        retry_max_s=0.2,
    )
    return Relay(config, engine.endpoint, engine.replay_endpoint, context=context).start()


def until(condition, timeout_s: float = 20.0) -> None:
    """Wait for what the relay's thread does over real sockets (no clock to advance there)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_the_relay_reports_with_an_engine_key(stack: LocalStack, made: Setup, engine: Engine):
    context = zmq.Context()
    relay = relay_with(stack, engine, made.instance, made.engine_key, context)
    try:
        until(lambda: relay.stats.complete)
        engine.store([11, 12, 13])
        until(lambda: made.held([11, 12, 13, 14]) == {HOST: "3"})
        assert not relay.stats.errors and not relay.stats.drops, relay.stats.summary()
    finally:
        relay.stop()
        context.term()


@pytest.mark.parametrize("which", ["revoked", "other group"])
def test_a_relay_without_a_usable_key_reports_nothing_and_says_why(
    stack: LocalStack, made: Setup, engine: Engine, which: str
):
    if which == "revoked":
        key_id = made.call("listApiKey", {"user_name": made.engine_user})["keys"][0]["key_id"]
        made.call("revokeApiKey", {"key_id": key_id})
        token, code = made.engine_key, "UNAUTHENTICATED"
    else:
        token, code = made.other_key, "PERMISSION_DENIED"
    context = zmq.Context()
    relay = relay_with(stack, engine, made.instance, token, context)
    try:
        until(lambda: code in relay.stats.not_ready.get("refused", ""))
        engine.store([21, 22])
        asked = relay.stats.requests
        until(lambda: relay.stats.requests >= asked + 3)  # refused again and again, never let in
        assert made.held([21, 22]) == {}
        assert relay.stats.items_sent == 0
    finally:
        relay.stop()
        context.term()
