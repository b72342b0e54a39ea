"""Authentication over HTTP with accounts in the real control plane: API keys, the admin
password bootstrap, auth status codes, limits checked before parsing, the audit log."""

import json
import logging

import pytest

from chalicelib.observability.logging import logger
from chalicelib.protocol.codes import Role
from tests.integration.control.harness import code, enable_auth, message, post

ADMIN_PW = "adm1n-pass-word"


@pytest.fixture
def secured(runtime, client):
    runtime.control.add_account("root", ADMIN_PW, Role.ROLE_ADMIN)
    runtime.control.add_account("bob", "", Role.ROLE_USER)
    enable_auth(runtime)
    return client


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


ROOT = bearer(f"root:{ADMIN_PW}")


def new_key(client, user_name, **extra):
    status, data = post(client, "createApiKey", {"user_name": user_name, **extra}, headers=ROOT)
    assert (status, code(data)) == (200, "OK"), data
    return data


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Basic cm9vdDp4"},
        bearer("root:wrong"),
        bearer(f"nobody:{ADMIN_PW}"),
        bearer("root"),
        bearer("kvcm_00.x"),
    ],
)
def test_missing_or_invalid_credentials_are_401_unauthenticated(secured, headers):
    status, data = post(secured, "listStorage", {}, headers=headers)
    assert (status, code(data)) == (401, "UNAUTHENTICATED") and message(data)


def test_credentials_are_checked_before_the_body_is_parsed(secured):
    assert post(secured, "listStorage", raw="{not json")[0] == 401
    assert post(secured, "listStorage", raw="{not json", headers=ROOT) == (400, {})


def test_body_size_and_trace_id_length_are_capped(secured, runtime):
    status, data = post(secured, "listStorage", raw=" " * (runtime.settings.max_body_bytes + 1), headers=ROOT)
    assert (status, code(data)) == (413, "INVALID_ARGUMENT")
    status, data = post(secured, "listStorage", {"trace_id": "t" * 257}, headers=ROOT)
    assert (status, code(data)) == (200, "INVALID_ARGUMENT") and "field 'trace_id'" in message(data)
    assert "t" * 257 not in json.dumps(data)  # not echoed in request_id


def test_an_api_key_is_shown_once_and_works_until_revoked(secured, runtime, clock):
    created = new_key(secured, "bob", expire_seconds=3600)
    api_key, key_id = created["api_key"], created["key_info"]["key_id"]
    assert api_key.startswith(f"kvcm_{key_id}.") and created["key_info"]["user_name"] == "bob"
    assert int(created["key_info"]["expire_time"]) - int(created["key_info"]["created_time"]) == 3600 * 10**6
    listed = post(secured, "listApiKey", {}, headers=ROOT)[1]
    assert [k["key_id"] for k in listed["keys"]] == [key_id] and api_key.split(".")[1] not in json.dumps(listed)
    status, data = post(secured, "getInstanceInfo", {"instance_id": "nope"}, headers=bearer(api_key))
    assert (status, code(data)) == (200, "INSTANCE_NOT_EXIST")
    # Revoked in another container: this one stops accepting it within the config refresh.
    from chalicelib.control import ControlPlane

    other = ControlPlane(lambda: runtime.aws("dynamodb"), runtime.control.table.name, clock)
    other.revoke_api_key(key_id)
    clock.advance(runtime.settings.config_refresh_s)
    status, data = post(secured, "getInstanceInfo", {"instance_id": "nope"}, headers=bearer(api_key))
    assert (status, code(data)) == (401, "UNAUTHENTICATED")


def test_rotation_keeps_the_old_key_until_it_is_revoked(secured):
    old = new_key(secured, "bob")
    new = new_key(secured, "bob")
    for key in (old, new):
        assert post(secured, "getInstanceInfo", {"instance_id": "x"}, headers=bearer(key["api_key"]))[0] == 200
    assert code(post(secured, "revokeApiKey", {"key_id": old["key_info"]["key_id"]}, headers=ROOT)[1]) == "OK"
    assert post(secured, "getInstanceInfo", {"instance_id": "x"}, headers=bearer(old["api_key"]))[0] == 401
    assert post(secured, "getInstanceInfo", {"instance_id": "x"}, headers=bearer(new["api_key"]))[0] == 200


def test_an_engine_role_is_403_permission_denied_on_admin_methods(secured):
    status, data = post(secured, "listAccount", {}, headers=bearer(new_key(secured, "bob")["api_key"]))
    assert (status, code(data)) == (403, "PERMISSION_DENIED") and "ROLE_USER" in message(data)


def test_an_engine_has_no_password_bearer(secured):
    assert post(secured, "getInstanceInfo", {"instance_id": "x"}, headers=bearer("bob:anything-at-all"))[0] == 401


def test_repeated_password_failures_are_429_without_checking(secured):
    for _ in range(5):
        assert post(secured, "listStorage", {}, headers=bearer("root:guess-guess"))[0] == 401
    status, data = post(secured, "listStorage", {}, headers=ROOT)
    assert (status, code(data)) == (429, "UNAUTHENTICATED") and "too many failed" in message(data)


@pytest.fixture
def service_log(caplog):
    """Every record of the service logger at DEBUG, however the process configured it
    (Chalice also configures a logger named after the app, "kvcm", with propagate off)."""
    service = logging.getLogger(logger.name)
    caplog.set_level(logging.DEBUG, logger=logger.name)
    service.addHandler(caplog.handler)
    yield caplog
    service.removeHandler(caplog.handler)


def test_secrets_never_reach_logs_or_the_audit_log_and_access_lines_name_the_principal(secured, service_log):
    key = new_key(secured, "bob")
    bodies = [
        post(secured, "listAccount", {}, headers=ROOT)[1],
        post(secured, "listAccount", {}, headers=bearer(f"root:{ADMIN_PW}x"))[1],
        post(secured, "addAccount", {"user_name": "carol", "password": "t0p-secret-pass", "role": 1}, headers=ROOT)[1],
        post(secured, "getInstanceInfo", {"instance_id": "x"}, headers=bearer(key["api_key"]))[1],
    ]
    audit = post(secured, "listAuditLog", {}, headers=ROOT)[1]
    logged = " ".join(repr(record.__dict__) for record in service_log.records)
    assert "'api': 'addAccount'" in logged and "'principal': 'root'" in logged
    assert f"'principal': 'bob/{key['key_info']['key_id']}'" in logged
    secret = key["api_key"].split(".")[1]
    for text in (ADMIN_PW, "t0p-secret-pass", secret):
        assert text not in repr(bodies) and text not in logged and text not in json.dumps(audit)


def test_mutations_and_denied_calls_are_audited(secured, runtime, clock):
    def step(method, body, headers):
        clock.advance(0.001)  # records sort by time
        return post(secured, method, body, headers=headers)[1]

    step("addAccount", {"user_name": "eve", "role": "ROLE_READ_ONLY"}, ROOT)
    step("removeStorage", {"storage_unique_name": "ghost"}, ROOT)
    step("listStorage", {}, ROOT)  # a read: not audited
    step("listStorage", {}, bearer("root:wrong-password"))
    eve = step("createApiKey", {"user_name": "eve"}, ROOT)
    step("removeStorage", {"storage_unique_name": "x"}, bearer(eve["api_key"]))
    records = post(secured, "listAuditLog", {}, headers=ROOT)[1]["records"]
    seen = [(r["principal"], r["api_name"], r["code"], r["target"]) for r in reversed(records)]
    assert seen == [
        ("root", "addAccount", "OK", "user_name=eve"),
        ("root", "removeStorage", "INVALID_ARGUMENT", "storage_unique_name=ghost"),
        ("unauthenticated:root", "listStorage", "UNAUTHENTICATED", ""),
        ("root", "createApiKey", "OK", "user_name=eve"),
        (f"eve/{eve['key_info']['key_id']}", "removeStorage", "PERMISSION_DENIED", ""),
    ]
    assert all(int(r["time"]) > 0 and r["source"] == "127.0.0.1" for r in records)  # Chalice's local gateway
    items = [
        i
        for i in runtime.aws("dynamodb").scan(TableName=runtime.control.table.name)["Items"]
        if i["pk"]["S"].startswith("AUDIT#")
    ]
    assert len(items) == 5 and all(int(i["expires_at"]["N"]) > runtime.clock.now() + 80 * 86400 for i in items)
    ttl = runtime.aws("dynamodb").describe_time_to_live(TableName=runtime.control.table.name)
    assert ttl["TimeToLiveDescription"] == {"TimeToLiveStatus": "ENABLED", "AttributeName": "expires_at"}


def test_a_flood_of_denied_calls_is_audited_at_a_bounded_rate(secured, runtime):
    for _ in range(25):
        post(secured, "listStorage", {}, headers=bearer("kvcm_0123456789abcdef." + "A" * 43))
    records = post(secured, "listAuditLog", {}, headers=ROOT)[1]["records"]
    assert len(records) == 10  # issue 28.13: 10 a minute per container, not 20 a second
    runtime.clock.advance(30)
    post(secured, "listStorage", {}, headers={})
    assert len(post(secured, "listAuditLog", {}, headers=ROOT)[1]["records"]) == 10  # same minute: counted only
    runtime.clock.advance(60)
    post(secured, "listStorage", {}, headers={})
    newest = post(secured, "listAuditLog", {"limit": 1}, headers=ROOT)[1]["records"][0]
    assert newest["principal"] == "anonymous" and "16 denied call(s) before this one not recorded" in newest["message"]


def test_the_first_admin_comes_from_the_control_cli(runtime, client, monkeypatch, capsys):
    """With auth on and no account, nothing over HTTP can add one: the CLI writes it into
    the control table with the operator's AWS credentials."""
    from chalicelib.control.__main__ import main
    from tests.integration.control.harness import TABLE

    enable_auth(runtime)
    assert post(client, "listAccount", {}, headers=ROOT)[0] == 401
    monkeypatch.setenv("KVCM_CONTROL_TABLE", TABLE)
    monkeypatch.setenv("KVCM_PASSWORD", ADMIN_PW)
    assert main(["add-account", "--user", "root"]) == 0  # a runtime of its own, from the environment
    status, data = post(client, "listAccount", {}, headers=ROOT)
    assert (status, code(data)) == (200, "OK")
    assert [(a["user_name"], a["role"]) for a in data["accounts"]] == [("root", "ROLE_ADMIN")]

    assert main(["add-account", "--user", "root", "--role", "ROLE_USER"]) == 1
    assert "already exists" in capsys.readouterr().err
    monkeypatch.setenv("KVCM_PASSWORD", "")
    assert main(["add-account", "--user", "eve"]) == 1
    assert "password" in capsys.readouterr().err
    assert main(["list-accounts"]) == 0
    assert capsys.readouterr().out == "root\tROLE_ADMIN\t*\n"
