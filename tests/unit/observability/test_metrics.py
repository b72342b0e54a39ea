"""The metrics registry's pending changes and the publisher's period (pure logic)."""

import math

from chalicelib.clock import ManualClock
from chalicelib.observability.metrics import COUNTER, GAUGE, MEAN, MetricsDelta, MetricsPublisher, MetricsRegistry

TAGS = {"api_name": "x"}
KEY = ("c", (("api_name", "x"),))


def test_drain_hands_over_the_changes_once_and_keeps_the_totals():
    registry = MetricsRegistry()
    registry.incr("c", 2, TAGS)
    registry.observe("m", 10)
    registry.observe("m", 20)
    registry.gauge("g", 1)
    delta = registry.drain()
    assert delta.counters == {KEY: 2} and delta.sums == {("m", ()): 30} and delta.counts == {("m", ()): 2}
    assert delta.gauges == {("g", ()): 1}
    assert [(p.name, p.kind, p.value) for p in delta.points()] == [("c", COUNTER, 2), ("g", GAUGE, 1), ("m", MEAN, 15)]
    assert not registry.drain()
    registry.incr("c", 1, TAGS)
    assert registry.drain().counters == {KEY: 1}
    assert registry.value("c", TAGS) == 3 and registry.value("m") == 15 and registry.value("g") == 1


def test_restored_changes_add_to_newer_ones_and_newer_gauges_win():
    registry = MetricsRegistry()
    registry.incr("c", 2, TAGS)
    registry.gauge("g", 1)
    failed = registry.drain()
    registry.incr("c", 3, TAGS)
    registry.gauge("g", 5)
    registry.restore(failed)
    delta = registry.drain()
    assert delta.counters == {KEY: 5} and delta.gauges == {("g", ()): 5}


def test_the_publisher_waits_a_period_unless_forced_and_keeps_what_failed():
    registry, clock, published = MetricsRegistry(), ManualClock(), []
    failing = [True]

    def add(delta: MetricsDelta) -> None:
        if failing[0]:
            raise ConnectionError("store down")
        published.append(delta)

    publisher = MetricsPublisher(registry, add, clock, period_s=1.0)
    registry.incr("c", 1, TAGS)
    assert publisher.publish(force=False) is False  # the store is down: kept
    registry.incr("c", 1, TAGS)
    failing[0] = False
    assert publisher.publish(force=False) is False and published == []  # not due yet
    clock.advance(1.0)
    assert publisher.publish(force=False) is True
    assert [d.counters for d in published] == [{KEY: 2}]
    registry.incr("c", 4, TAGS)
    assert publisher.publish() is True and published[-1].counters == {KEY: 4}  # forced
    assert publisher.publish() is True and len(published) == 2  # nothing new: nothing sent


def test_an_unforced_publication_never_waits_for_another_thread():
    import threading

    registry, entered, release = MetricsRegistry(), threading.Event(), threading.Event()

    def slow_add(delta: MetricsDelta) -> None:
        entered.set()
        release.wait(5)

    publisher = MetricsPublisher(registry, slow_add, ManualClock(), period_s=0)
    registry.incr("c")
    worker = threading.Thread(target=publisher.publish)
    worker.start()
    assert entered.wait(5)
    registry.incr("c")
    assert publisher.publish(force=False) is False  # returns at once: the other thread publishes
    release.set()
    worker.join(5)
    assert registry.drain().counters == {("c", ()): 1}  # still pending for the next one


def test_calls_are_tagged_with_the_upstream_rpc_name():
    registry = MetricsRegistry()
    registry.record_call("getCacheLocation", "OK", 120)
    registry.record_call("addStorage", "INVALID_ARGUMENT", 80)
    delta = registry.drain()
    assert delta.counters == {
        ("service.query_counter", (("api_name", "GetCacheLocation"),)): 1,
        ("service.query_counter", (("api_name", "AddStorage"),)): 1,
        ("service.error_counter", (("api_name", "AddStorage"), ("code", "INVALID_ARGUMENT"))): 1,
    }
    assert registry.value("service.query_rt_us", {"api_name": "GetCacheLocation"}) == 120


def test_a_histogram_counts_each_sample_in_the_first_bucket_that_holds_it():
    registry = MetricsRegistry()
    for latency in (100, 250, 251, 40_000, 10**9):
        registry.histogram("service.call_latency_us", latency, {"api_name": "GetCacheLocation"})
    key = ("service.call_latency_us", (("api_name", "GetCacheLocation"),))
    delta = registry.drain()
    assert dict(delta.buckets) == {(key, 250): 2, (key, 500): 1, (key, 50_000): 1, (key, math.inf): 1}
    assert delta.counts[key] == 5 and delta.sums[key] == 100 + 250 + 251 + 40_000 + 10**9
    merged = MetricsDelta()
    merged.merge(delta)
    merged.merge(delta)
    assert merged.buckets[(key, 250)] == 4


def test_forgetting_a_tag_drops_its_series_published_or_not():
    registry = MetricsRegistry()
    registry.gauge("cache_manager_instance.byte_size", 9, {"instance_id": "i1", "instance_group": "g"})
    registry.histogram("service.call_latency_us", 9, {"instance_id": "i1"})
    registry.drain()
    registry.incr("manager.get_cache_location_hit_block_counter", 3, {"instance_id": "i1"})
    registry.incr("manager.get_cache_location_hit_block_counter", 4, {"instance_id": "i10"})
    registry.forget("instance_id", "i1")
    assert registry.value("cache_manager_instance.byte_size", {"instance_id": "i1", "instance_group": "g"}) is None
    assert registry.value("service.call_latency_us", {"instance_id": "i1"}) is None
    pending = registry.drain()
    assert dict(pending.counters) == {("manager.get_cache_location_hit_block_counter", (("instance_id", "i10"),)): 4}
