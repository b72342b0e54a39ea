"""AdminService metrics, health, lease ("leader") and logger methods over HTTP."""

import pytest

from chalicelib.observability.logging import logger
from tests.integration.control.harness import call, code, message


def test_get_metrics_counts_calls(client, runtime, clock):
    call(client, "listStorage")
    call(client, "listStorage")
    call(client, "removeStorage", {"storage_unique_name": "ghost"})
    data = call(client, "getMetrics")
    assert data["timestamp"] == str(int(clock.now() * 1000))
    by_key = {
        (m["metric_name"], tuple((t["tag_key"], t["tag_value"]) for t in m["metric_tags"])): m["metric_value"]
        for m in data["metrics"]
    }
    assert by_key[("service.query_counter", (("api_name", "ListStorage"),))] == {"int_value": "2"}
    assert by_key[("service.query_counter", (("api_name", "RemoveStorage"),))] == {"int_value": "1"}
    assert by_key[("service.error_counter", (("api_name", "RemoveStorage"), ("code", "INVALID_ARGUMENT")))] == {
        "int_value": "1"
    }
    rt = by_key[("service.query_rt_us", (("api_name", "ListStorage"),))]
    assert set(rt) == {"float_value"} and rt["float_value"] > 0
    assert ("service.query_counter", (("api_name", "GetMetrics"),)) not in by_key  # recorded after answering
    again = call(client, "getMetrics")
    assert any(
        m["metric_name"] == "service.query_counter" and m["metric_tags"][0]["tag_value"] == "GetMetrics"
        for m in again["metrics"]
    )


def metric_values(data: dict) -> dict:
    return {
        (m["metric_name"], tuple((t["tag_key"], t["tag_value"]) for t in m["metric_tags"])): next(
            iter(m["metric_value"].values())
        )
        for m in data["metrics"]
    }


def test_get_metrics_adds_up_every_container(client, runtime, clock, other_container):
    """Another container (another Runtime on the same Valkey) publishes its calls and its
    jobs' gauges; whichever container answers getMetrics reports the sums."""
    from chalicelib.routes.admin import OPERATIONS
    from chalicelib.routes.dispatch import Dispatcher

    other = other_container
    dispatcher = Dispatcher(OPERATIONS)
    for _ in range(3):
        assert dispatcher.handle(other, "listStorage", "{}", {})[0] == 200
        clock.advance(0.4)
    other.metrics.gauge("data_storage.healthy_status", 0, {"storage": "nfs_01"})
    other.metrics_publisher.publish()  # what a job does at its end
    call(client, "listStorage")
    values = metric_values(call(client, "getMetrics"))
    assert values[("service.query_counter", (("api_name", "ListStorage"),))] == "4"
    assert values[("data_storage.healthy_status", (("storage", "nfs_01"),))] == 0.0
    mean = values[("service.query_rt_us", (("api_name", "ListStorage"),))]
    latencies = [rt.metrics.value("service.query_rt_us", {"api_name": "ListStorage"}) for rt in (runtime, other)]
    assert mean == pytest.approx((latencies[0] * 1 + latencies[1] * 3) / 4)


def test_get_metrics_without_valkey_is_service_not_ready(client, runtime, monkeypatch):
    import redis

    def down(*args, **kwargs):
        raise redis.ConnectionError("valkey down")

    call(client, "listStorage")
    monkeypatch.setattr(runtime.metrics_store.client, "hgetall", down)
    monkeypatch.setattr(runtime.metrics_store, "_add", down)
    data = call(client, "getMetrics")
    assert code(data) == "SERVICE_NOT_READY" and "metrics" in message(data)
    monkeypatch.undo()
    values = metric_values(call(client, "getMetrics"))  # nothing was lost meanwhile
    assert values[("service.query_counter", (("api_name", "ListStorage"),))] == "1"
    assert values[("service.error_counter", (("api_name", "GetMetrics"), ("code", "SERVICE_NOT_READY")))] == "1"


def test_check_health(client, runtime, clock):
    data = call(client, "checkHealth")
    assert (code(data), data["is_health"], data["is_leader"], data["elector_last_loop_time_ms"]) == (
        "OK",
        True,
        False,
        "0",
    )
    runtime.lease.try_acquire()
    data = call(client, "checkHealth")
    assert data["is_leader"] is True and data["elector_last_loop_time_ms"] == str(int(clock.now() * 1000))


def test_check_health_reports_a_missing_control_table(client, runtime):
    runtime.aws("dynamodb").delete_table(TableName=runtime.settings.control_table)
    data = call(client, "checkHealth")
    assert (code(data), data["is_health"]) == ("OK", False)


def test_cluster_info_and_demote(client, runtime, clock, valkey):
    info = call(client, "getManagerClusterInfo")
    assert (info["self_node_id"], info["leader_node_id"], info["self_leader_expiration_time"]) == ("node-a", "", "0")
    assert info["info_updated_time"] == str(int(clock.now() * 1e6))
    assert runtime.lease.try_acquire()
    info = call(client, "getManagerClusterInfo")
    assert info["leader_node_id"] == "node-a"
    expiry = int(info["self_leader_expiration_time"])
    assert abs(expiry - (clock.now() * 1e6 + runtime.settings.lease_ttl_ms * 1000)) < 100_000
    assert code(call(client, "leaderDemote")) == "OK"
    assert runtime.lease.holder() is None
    data = call(client, "leaderDemote")
    assert code(data) == "SERVER_NOT_LEADER" and "node-a" in message(data)


def test_demote_refused_when_another_node_leads(client, runtime, clock, valkey):
    from chalicelib.stores.lease import Lease

    other = Lease(valkey, prefix=runtime.settings.key_prefix, node_id="node-b", ttl_ms=10_000, clock=clock)
    assert other.try_acquire()
    data = call(client, "leaderDemote")
    assert code(data) == "SERVER_NOT_LEADER" and "node-b" in message(data)
    info = call(client, "getManagerClusterInfo")
    assert (info["leader_node_id"], info["self_leader_expiration_time"]) == ("node-b", "0")
    assert other.holder() == "node-b"


def test_leader_elector_config(client, runtime):
    assert call(client, "getLeaderElectorConfig")["campaign_delay_time_ms"] == "0"
    assert code(call(client, "updateLeaderElectorConfig", {"campaignDelayTimeMs": "1500"})) == "OK"
    assert call(client, "getLeaderElectorConfig")["campaign_delay_time_ms"] == "1500"
    assert runtime.lease.campaign_delay_ms() == 1500


@pytest.fixture
def restore_log_level():
    level = logger.log_level
    yield
    logger.setLevel(level)


@pytest.mark.parametrize("name, level", [("DEBUG", 10), ("warn", 30), ("ERROR", 40), ("INFO", 20)])
def test_update_logger(client, restore_log_level, name, level):
    assert code(call(client, "updateLogger", {"module_name": "kvcm", "log_level": name})) == "OK"
    assert logger.log_level == level


def test_update_logger_reaches_other_containers(client, runtime, clock, other_container, restore_log_level):
    """The level is stored in the control plane: another container (its own config cache)
    applies it when its catalog is next loaded, that is within the config refresh period."""
    from chalicelib.control.errors import UnknownEntityError

    other = other_container

    def lookup():  # any lookup loads the catalog when it is stale
        with pytest.raises(UnknownEntityError):
            other.config.group("g")

    lookup()  # warm: this container loaded its catalog before the change
    assert code(call(client, "updateLogger", {"log_level": "debug"})) == "OK"
    logger.setLevel("INFO")  # the process's logger stands for the other container's
    lookup()
    assert logger.log_level == 20  # cached: not seen yet
    clock.advance(other.settings.config_refresh_s)
    lookup()
    assert logger.log_level == 10
    assert runtime.control.log_level() == "DEBUG"
