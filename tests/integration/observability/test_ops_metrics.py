"""GET /metrics: the service's metrics in the Prometheus text format, over HTTP."""

from chalicelib.protocol.codes import Role
from tests.integration.control.harness import call, enable_auth


def scrape(client, headers=None):
    response = client.http.get("/metrics", headers=headers or {})
    return response.status_code, response.headers.get("Content-Type", ""), response.body.decode()


def test_metrics_of_every_container_in_the_text_format(client, runtime, other_container):
    other = other_container
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
    # the latency histogram, through the shared store: a p99 to alert on
    assert "# TYPE kvcmtest_service_call_latency_us histogram" in lines
    assert 'kvcmtest_service_call_latency_us_bucket{api_name="ListStorage",le="+Inf"} 1' in lines
    assert 'kvcmtest_service_call_latency_us_count{api_name="ListStorage"} 1' in lines
    assert 'kvcmtest_data_storage_healthy_status{storage="nfs_01"} 1.0' in lines


def test_with_auth_on_a_scrape_needs_a_service_wide_reader(client, runtime):
    control = runtime.control
    control.add_account("root", "admin-pass-12", Role.ROLE_ADMIN)
    control.add_account("prom", "", Role.ROLE_READ_ONLY)
    control.add_account("bob", "", Role.ROLE_ENGINE)
    control.add_account("g1-reader", "", Role.ROLE_READ_ONLY, groups=["g1"])
    keys = {
        name: {"Authorization": f"Bearer {control.create_api_key(name, 3600)[0]}"}
        for name in ("prom", "bob", "g1-reader")
    }
    enable_auth(runtime)
    assert scrape(client)[0] == 401
    assert scrape(client, keys["bob"])[0] == 403
    assert scrape(client, keys["g1-reader"])[0] == 403
    assert scrape(client, keys["prom"])[0] == 200
    assert scrape(client, {"Authorization": "Bearer root:admin-pass-12"})[0] == 200


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
