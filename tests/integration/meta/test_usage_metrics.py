"""UPSTREAM_V2 §2.16's names on GET /metrics: the per-read hit counters and the usage
gauges the ``usage_metrics`` schedule publishes."""

from tests.integration.meta.harness import code, write


def _published(runtime) -> dict:
    runtime.metrics_publisher.publish()
    return {(p.name, p.tags): p.value for p in runtime.metrics_store.totals().points()}


def test_reads_count_queried_and_hit_blocks(http, instance, runtime):
    write(http, [1, 2, 3])
    resp = http(
        "getCacheLocation", {"instance_id": "i1", "query_type": "QT_PREFIX_MATCH", "block_keys": [1, 2, 3, 4, 5]}
    )
    assert code(resp) == "OK" and len(resp["locations"]) == 3
    http("getCacheLocation", {"instance_id": "i1", "query_type": "QT_BATCH_GET", "block_keys": [2, 9]})
    published = _published(runtime)
    tags = (("instance_id", "i1"),)
    assert published[("manager.get_cache_location_query_block_counter", tags)] == 7
    assert published[("manager.get_cache_location_hit_block_counter", tags)] == 4
    assert published[("manager.request_key_count", tags)] == 3.5  # a mean over the two reads
    assert published[("manager.prefix_match_time_us", tags)] > 0


def test_the_schedule_publishes_group_and_instance_usage(http, instance, runtime, group):
    write(http, [1, 2, 3])
    assert runtime.usage_metrics.run() == {"groups": 1, "instances": 1}
    published = _published(runtime)
    block_bytes = 2 * 1024
    instance_tags = (("instance_group", "g1"), ("instance_id", "i1"))
    assert published[("cache_manager_instance.key_count", instance_tags)] == 3
    assert published[("cache_manager_instance.byte_size", instance_tags)] == 3 * block_bytes
    assert published[("cache_manager_group.usage_ratio", (("instance_group", "g1"),))] == 3 * block_bytes / (1 << 30)
    assert published[("meta_indexer.total_key_count", ())] == 3
    assert published[("meta_indexer.total_cache_usage", ())] == 3 * block_bytes


def test_only_the_lease_holder_publishes(http, instance, runtime, other_container):
    assert other_container.lease.try_acquire()
    assert runtime.usage_metrics.run() == {"skipped": "lease held by another node"}
