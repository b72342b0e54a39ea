"""The functions sign in to Valkey as the template's service user: credentials from the
settings or from a Secrets Manager secret, and the user's access string (read from
infra/kvcm.yaml) allows everything KVCM does on its keys and nothing outside them."""

from __future__ import annotations

import json

import pytest
import redis
import yaml

from chalicelib.runtime import Runtime
from chalicelib.settings import Settings
from local_stack.config import REPO_ROOT

USER = "kvcm-auth-test"
PASSWORD = "rehearsal-password-0123456789"


@pytest.fixture
def service_user(valkey):
    """The template's service user, created in the test Valkey with its access string."""
    template = yaml.safe_load((REPO_ROOT / "infra" / "kvcm.yaml").read_text())
    access = template["Resources"]["ValkeyServiceUser"]["Properties"]["AccessString"].split()
    valkey.execute_command("ACL", "SETUSER", USER, "reset", f">{PASSWORD}", *access)
    yield USER
    valkey.execute_command("ACL", "DELUSER", USER)


def settings_credentials(aws) -> dict:
    return {"valkey_username": USER, "valkey_password": PASSWORD}


def secret_credentials(aws) -> dict:
    import boto3

    arn = boto3.client("secretsmanager").create_secret(
        Name="kvcm-test-valkey", SecretString=json.dumps({"username": USER, "password": PASSWORD})
    )["ARN"]
    return {"valkey_secret_arn": arn}


@pytest.mark.parametrize("credentials", [settings_credentials, secret_credentials])
def test_runtime_signs_in_as_the_service_user(service_user, valkey_url, aws, credentials):
    runtime = Runtime(Settings(valkey_url=valkey_url, node_id="auth-test", **credentials(aws)))
    client = runtime.valkey
    assert client.acl_whoami() == USER
    # scripts on the service's keys (the lease is a Lua script on {kvcm:lease}), plain keys
    assert runtime.lease.try_acquire()
    client.set("kvcm:auth-test", "x")
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.set("other-service:key", "x")
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.flushall()


def test_without_credentials_the_service_user_is_not_assumed(service_user, valkey_url):
    runtime = Runtime(Settings(valkey_url=valkey_url, node_id="auth-test"))
    assert runtime.valkey.acl_whoami() == "default"
