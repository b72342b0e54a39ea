"""Anonymous callers lock nobody out (issue 28.1, 28.2): over HTTP with the real control
plane, the clock injected, the gateway's source address set per request."""

import chalice.local
import pytest

from chalicelib.control.api_keys import new_api_key
from chalicelib.protocol.codes import Role
from chalicelib.protocol.models import StorageConfig
from tests.integration.control.harness import code, enable_auth, group, nfs, post, register_request

ADMIN_PW = "adm1n-pass-word"
LEGIT_SOURCE = "10.0.0.1"


@pytest.fixture
def secured(runtime, client):
    control = runtime.control
    control.add_storage(StorageConfig.model_validate(nfs("nfs1", "/tmp/kvcm-lockout")))
    control.create_group(group("g1", "nfs1"))
    control.register_instance(register_request("i1", "g1"))
    control.add_account("root", ADMIN_PW, Role.ROLE_ADMIN)
    control.add_account("engine", "", Role.ROLE_USER)
    control.add_account("operator", "", Role.ROLE_OPERATOR)
    keys = {
        name: {"Authorization": f"Bearer {control.create_api_key(name, 3600)[0]}"}
        for name in ("root", "engine", "operator")
    }
    enable_auth(runtime)
    return keys


@pytest.fixture
def source(monkeypatch):
    """``source(ip)``: the address API Gateway reports for the next requests."""

    def set_source(ip: str) -> None:
        monkeypatch.setattr(chalice.local.LambdaEventConverter, "LOCAL_SOURCE_IP", ip)

    return set_source


def legit_calls(client, keys) -> list[tuple[str, int, str]]:
    """(key, HTTP status, code) of one ordinary call per legitimate key."""
    answers = []
    for name, headers in keys.items():
        status, data = post(client, "getInstanceInfo", {"instance_id": "i1"}, headers=headers)
        answers.append((name, status, code(data)))
    return answers


def random_keys(client, source, count: int, sources: list[str]) -> set[int]:
    """HTTP statuses of ``count`` calls with random API keys, from ``sources`` in turn."""
    statuses = set()
    for i in range(count):
        source(sources[i % len(sources)])
        headers = {"Authorization": f"Bearer {new_api_key()[1]}"}
        statuses.add(post(client, "getInstanceInfo", {"instance_id": "i1"}, headers=headers)[0])
    return statuses


OK = [("root", 200, "OK"), ("engine", 200, "OK"), ("operator", 200, "OK")]


def test_a_flood_of_random_keys_then_a_config_change_locks_no_legitimate_key_out(
    secured, client, runtime, source, clock
):
    source(LEGIT_SOURCE)
    assert legit_calls(client, secured) == OK
    # 650 random bearers from 13 addresses: past every per-source and node-wide bound.
    assert random_keys(client, source, 650, [f"10.6.6.{i}" for i in range(13)]) == {401, 429}
    source(LEGIT_SOURCE)
    register = register_request("i2", "g1").model_dump(mode="json")
    status, data = post(client, "registerInstance", register, headers=secured["engine"])
    assert (status, code(data)) == (200, "OK")  # moves the config epoch
    clock.advance(runtime.settings.config_refresh_s)
    assert legit_calls(client, secured) == OK  # known keys are kept across the epoch change
    runtime.config.invalidate()  # a fresh container: it has never seen the keys
    source("10.0.0.2")
    assert legit_calls(client, secured) == OK


def test_legitimate_keys_pass_through_a_steady_flood_with_config_churn(secured, client, runtime, source, clock):
    """A burst of 650 random keys, then 10 a second for 30 s while an engine registers an
    instance a second: every legitimate call of every second succeeds."""
    random_keys(client, source, 650, [f"10.5.5.{i}" for i in range(13)])
    refused = []
    for second in range(30):
        random_keys(client, source, 10, [f"10.6.{second}.{i}" for i in range(2)])
        source(LEGIT_SOURCE)
        register = register_request(f"churn-{second}", "g1").model_dump(mode="json")
        assert code(post(client, "registerInstance", register, headers=secured["engine"])[1]) == "OK"
        refused += [answer for answer in legit_calls(client, secured) if answer[1:] != (200, "OK")]
        clock.advance(1.0)
    assert refused == []


def test_password_guesses_from_elsewhere_never_lock_the_admin_out(secured, client, source, clock):
    """1 guess a second at the admin's password for 35 s, from another address: the admin,
    checking every second from its own, is never refused."""
    root = {"Authorization": f"Bearer root:{ADMIN_PW}"}
    source(LEGIT_SOURCE)
    assert post(client, "listStorage", {}, headers=root)[0] == 200
    refused = 0
    for second in range(35):
        source("10.6.6.6")
        post(client, "listStorage", {}, headers={"Authorization": f"Bearer root:guess-{second:04d}-pw"})
        source(LEGIT_SOURCE)
        refused += post(client, "listStorage", {}, headers=root)[0] != 200
        clock.advance(1.0)
    assert refused == 0
    clock.advance(11)  # past the verified-credentials cache
    source("10.6.6.6")  # the guesser's own pair is locked
    assert post(client, "listStorage", {}, headers=root)[0] == 429


def test_a_node_wide_password_flood_spares_a_pair_verified_recently(secured, client, source, clock):
    root = {"Authorization": f"Bearer root:{ADMIN_PW}"}
    source(LEGIT_SOURCE)
    assert post(client, "listStorage", {}, headers=root)[0] == 200
    clock.advance(60)  # past the verified-credentials cache: the next call runs scrypt again
    for i in range(61):  # past the node-wide bound, one guess per address
        source(f"10.7.{i // 200}.{i % 200}")
        post(client, "listStorage", {}, headers={"Authorization": f"Bearer root:guess-{i:04d}-pw"})
    source("10.0.0.9")  # a pair that never verified: the node-wide bound holds
    assert post(client, "listStorage", {}, headers=root)[0] == 429
    source(LEGIT_SOURCE)
    assert post(client, "listStorage", {}, headers=root)[0] == 200
