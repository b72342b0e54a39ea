"""GET /metrics: the service's metrics in the Prometheus text format, over HTTP."""
import pytest

from chalicelib.protocol.codes import Role
from tests.integration.control.harness import call, client, enable_auth, runtime  # noqa: F401


def scrape(client, headers=None):
    response = client.http.get("/metrics", headers=headers or {})
    return response.status_code, response.headers.get("Content-Type", ""), response.body.decode()


def test_metrics_of_every_container_in_the_text_format(client, runtime, clock, valkey, valkey_url):
    from tests.integration.control.harness import build_runtime

    other = build_runtime(valkey_url, clock, valkey, node_id="node-b")
    other.metrics.incr("service.query_counter", 3, {"api_name": "ListStorage"})
    other.metrics.gauge("data_storage.healthy_status", 1, {"storage": "nfs_01"})
    other.metrics_publisher.publish()
    call(client, "listStorage")
    status, content_type, body = scrape(client)
    assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
    lines = body.splitlines()
    assert "# TYPE kvcmtest_service_query_counter_total counter" in lines
    assert 'kvcmtest_service_query_counter_total{api_name="ListStorage"} 4' in lines
    assert 'kvcmtest_service_query_rt_us_count{api_name="ListStorage"} 1' in lines
    assert 'kvcmtest_data_storage_healthy_status{storage="nfs_01"} 1.0' in lines


def test_with_auth_on_a_scrape_needs_an_admin(client, runtime):
    runtime.control.add_account("prom", "scrape-pass", Role.ROLE_ADMIN)
    runtime.control.add_account("bob", "user-pass", Role.ROLE_USER)
    enable_auth(runtime)
    assert scrape(client)[0] == 401
    assert scrape(client, {"Authorization": "Bearer bob:user-pass"})[0] == 403
    assert scrape(client, {"Authorization": "Bearer prom:scrape-pass"})[0] == 200


def test_an_unreachable_store_is_503_not_a_traceback(client, runtime, monkeypatch):
    import redis

    def down(*args, **kwargs):
        raise redis.ConnectionError("valkey down")

    monkeypatch.setattr(runtime.metrics_store, "_add", down)
    call(client, "listStorage")
    status, _, body = scrape(client)
    assert status == 503 and body.startswith("SERVICE_NOT_READY: metrics store unavailable")
    monkeypatch.setattr(runtime.metrics_store.client, "hgetall", down)
    monkeypatch.setattr(runtime.metrics_publisher, "publish", lambda force=True: True)
    assert scrape(client)[0] == 503
