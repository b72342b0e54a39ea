"""Authentication and roles over HTTP with accounts in the real control plane."""
import logging

import pytest

from chalicelib.observability.logging import logger
from chalicelib.protocol.codes import Role
from chalicelib.protocol.errors import ForbiddenError, UnauthorizedError
from tests.integration.control.harness import client, code, enable_auth, post, runtime  # noqa: F401

ADMIN_PW, USER_PW = "adm1n-pass", "us3r:pass"


@pytest.fixture
def secured(runtime, client):
    runtime.control.add_account("root", ADMIN_PW, Role.ROLE_ADMIN)
    runtime.control.add_account("bob", USER_PW, Role.ROLE_USER)
    enable_auth(runtime)
    return client


def bearer(user, password):
    return {"Authorization": f"Bearer {user}:{password}"}


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Basic cm9vdDp4"}, bearer("root", "wrong"),
                                     bearer("nobody", ADMIN_PW), {"Authorization": "Bearer root"}])
def test_missing_or_invalid_credentials_are_401(secured, headers):
    status, data = post(secured, "listStorage", {}, headers=headers)
    assert status == 401
    assert code(data) == "INVALID_ARGUMENT" and data["header"]["status"]["message"]


def test_user_role_is_403_on_admin_methods(secured):
    status, data = post(secured, "listAccount", {}, headers=bearer("bob", USER_PW))
    assert status == 403 and "ROLE_USER" in data["header"]["status"]["message"]


def test_admin_role_may_call_admin_methods(secured):
    status, data = post(secured, "listAccount", {}, headers=bearer("root", ADMIN_PW))
    assert (status, code(data)) == (200, "OK")
    assert {a["user_name"] for a in data["accounts"]} == {"root", "bob"}


def test_user_role_may_call_the_meta_service(secured, runtime):
    assert runtime.auth.authorize(bearer("bob", USER_PW), "meta").role == Role.ROLE_USER
    with pytest.raises(ForbiddenError):
        runtime.auth.authorize(bearer("bob", USER_PW), "debug")


def test_verified_credentials_are_cached_and_deletion_takes_effect_after_ttl(secured, runtime, clock, monkeypatch):
    calls = []
    real = runtime.control.verify_account
    monkeypatch.setattr(runtime.control, "verify_account", lambda *a: calls.append(a[0]) or real(*a))
    for _ in range(3):
        assert post(secured, "checkHealth", {}, headers=bearer("root", ADMIN_PW))[0] == 200
    assert calls == ["root"]
    runtime.control.delete_account("root")
    clock.advance(11)
    with pytest.raises(UnauthorizedError):
        runtime.auth.authorize(bearer("root", ADMIN_PW), "admin")


@pytest.fixture
def service_log(caplog):
    """Every record of the service logger at DEBUG, however the process configured it
    (Chalice also configures a logger named after the app, "kvcm", with propagate off)."""
    service = logging.getLogger(logger.name)
    caplog.set_level(logging.DEBUG, logger=logger.name)
    service.addHandler(caplog.handler)
    yield caplog
    service.removeHandler(caplog.handler)


def test_passwords_never_reach_responses_or_logs(secured, service_log):
    bodies = [post(secured, "listAccount", {}, headers=bearer("root", ADMIN_PW))[1],
              post(secured, "listAccount", {}, headers=bearer("root", ADMIN_PW + "x"))[1],
              post(secured, "addAccount", {"user_name": "carol", "password": "t0p-secret"},
                   headers=bearer("root", ADMIN_PW))[1]]
    logged = " ".join(repr(record.__dict__) for record in service_log.records)
    assert "'api': 'addAccount'" in logged  # the access logs were captured, extras included
    for secret in (ADMIN_PW, USER_PW, "t0p-secret"):
        assert secret not in repr(bodies) and secret not in logged


def test_the_first_admin_comes_from_the_control_cli(runtime, client, monkeypatch, capsys):
    """With auth on and no account, nothing over HTTP can add one: the CLI writes it into
    the control table with the operator's AWS credentials."""
    from chalicelib.control.__main__ import main
    from tests.integration.control.harness import TABLE

    enable_auth(runtime)
    assert post(client, "listAccount", {}, headers=bearer("root", ADMIN_PW))[0] == 401
    monkeypatch.setenv("KVCM_CONTROL_TABLE", TABLE)
    monkeypatch.setenv("KVCM_PASSWORD", ADMIN_PW)
    assert main(["add-account", "--user", "root"]) == 0  # a runtime of its own, from the environment
    status, data = post(client, "listAccount", {}, headers=bearer("root", ADMIN_PW))
    assert (status, code(data)) == (200, "OK")
    assert [(a["user_name"], a["role"]) for a in data["accounts"]] == [("root", "ROLE_ADMIN")]

    assert main(["add-account", "--user", "root", "--role", "ROLE_USER"]) == 1
    assert "already exists" in capsys.readouterr().err
    monkeypatch.setenv("KVCM_PASSWORD", "")
    assert main(["add-account", "--user", "eve"]) == 1
    assert "password" in capsys.readouterr().err
    assert main(["list-accounts"]) == 0
    assert capsys.readouterr().out == "root\tROLE_ADMIN\n"
