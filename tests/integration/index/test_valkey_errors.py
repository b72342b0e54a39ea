"""What counts as "Valkey cannot serve now" (SERVICE_NOT_READY) and what stays an error."""

import pytest
import redis
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    ReadOnlyError,
    RedisClusterException,
    TryAgainError,
)

from chalicelib.runtime import Runtime
from chalicelib.settings import Settings
from chalicelib.valkey import ValkeyUnavailableError, valkey_errors
from tests.helpers import free_port


@pytest.mark.parametrize(
    "error",
    [
        redis.ConnectionError("refused"),
        redis.TimeoutError("timed out"),
        ClusterDownError("CLUSTERDOWN"),
        TryAgainError("TRYAGAIN"),
        ReadOnlyError("READONLY replica"),
        MovedError("3999 127.0.0.1:6381"),
        AskError("3999 127.0.0.1:6381"),
        redis.ResponseError("BUSY Redis is busy running a script"),
        redis.ResponseError(
            "Command # 1 (HGETALL {t:i}:u) of pipeline caused error: BUSY Valkey is busy running a script"
        ),
        RedisClusterException("Redis Cluster cannot be connected. Please provide at least one reachable node"),
    ],
)
def test_unavailable_answers_become_index_unavailable(error):
    with pytest.raises(ValkeyUnavailableError, match="^index unavailable: "):
        with valkey_errors("index"):
            raise error


@pytest.mark.parametrize(
    "error",
    [
        redis.ResponseError("ERR wrong number of arguments"),
        redis.ResponseError("BUSYGROUP Consumer Group name already exists"),
        RedisClusterException("Keys in request don't hash to the same slot"),
    ],
)
def test_other_errors_stay_what_they_are(error):
    with pytest.raises(type(error)):
        with valkey_errors("index"):
            raise error


def test_a_cluster_client_that_cannot_connect_is_service_not_ready():
    runtime = Runtime(settings=Settings(valkey_url=f"redis://127.0.0.1:{free_port()}/0", valkey_cluster=True))
    with pytest.raises(ValkeyUnavailableError, match="cannot be connected"):
        _ = runtime.valkey
