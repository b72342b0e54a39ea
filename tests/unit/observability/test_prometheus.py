"""The Prometheus text exposition of metric totals (pure)."""

from chalicelib.observability.metrics import CALL_LATENCY_BOUNDS_US, MetricsDelta, MetricsRegistry
from chalicelib.observability.prometheus import exposition


def test_counters_summaries_and_gauges():
    totals = MetricsDelta()
    totals.counters[("service.query_counter", (("api_name", "GetCacheLocation"),))] = 7
    totals.counters[("service.query_counter", (("api_name", "StartWriteCache"),))] = 2
    totals.sums[("service.query_rt_us", (("api_name", "GetCacheLocation"),))] = 350.5
    totals.counts[("service.query_rt_us", (("api_name", "GetCacheLocation"),))] = 7
    totals.gauges[("data_storage.healthy_status", (("storage", 'nfs "a"\\b\nc'),))] = 1.0
    assert exposition(totals).splitlines() == [
        "# TYPE kvcm_service_query_counter_total counter",
        'kvcm_service_query_counter_total{api_name="GetCacheLocation"} 7',
        'kvcm_service_query_counter_total{api_name="StartWriteCache"} 2',
        "# TYPE kvcm_service_query_rt_us summary",
        'kvcm_service_query_rt_us_sum{api_name="GetCacheLocation"} 350.5',
        'kvcm_service_query_rt_us_count{api_name="GetCacheLocation"} 7',
        "# TYPE kvcm_data_storage_healthy_status gauge",
        'kvcm_data_storage_healthy_status{storage="nfs \\"a\\"\\\\b\\nc"} 1.0',
    ]


def test_nothing_recorded_is_an_empty_body_and_names_are_sanitized():
    assert exposition(MetricsDelta()) == ""
    totals = MetricsDelta()
    totals.counters[("a-b.c", (("tag.key", "v"),))] = 1
    assert exposition(totals, prefix="my-kvcm").splitlines()[1] == 'my_kvcm_a_b_c_total{tag_key="v"} 1'


def test_a_histogram_has_cumulative_buckets_of_every_bound_then_inf():
    registry = MetricsRegistry()
    for latency in (100, 600, 600, 10**9):
        registry.histogram("service.call_latency_us", latency, {"api_name": "X"})
    lines = exposition(registry.drain()).splitlines()
    assert lines[0] == "# TYPE kvcm_service_call_latency_us histogram"
    buckets = [line for line in lines if "_bucket" in line]
    assert len(buckets) == len(CALL_LATENCY_BOUNDS_US) + 1
    assert buckets[:3] == [
        'kvcm_service_call_latency_us_bucket{api_name="X",le="250"} 1',
        'kvcm_service_call_latency_us_bucket{api_name="X",le="500"} 1',
        'kvcm_service_call_latency_us_bucket{api_name="X",le="1000"} 3',
    ]
    assert buckets[-2:] == [
        'kvcm_service_call_latency_us_bucket{api_name="X",le="29000000"} 3',
        'kvcm_service_call_latency_us_bucket{api_name="X",le="+Inf"} 4',
    ]
    assert lines[-1] == 'kvcm_service_call_latency_us_count{api_name="X"} 4'
