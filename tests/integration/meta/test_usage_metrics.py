"""UPSTREAM_V2 §2.16's names on GET /metrics: the per-read hit counters and the usage
gauges the ``usage_metrics`` schedule publishes."""

import io
import json

import pytest

from chalicelib.observability.emf import EmfWriter
from chalicelib.protocol.errors import InstanceNotFoundError
from tests.integration.meta.harness import code, register, write


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


def _series_of(published: dict, tag: tuple[str, str]) -> list:
    return sorted(name for name, tags in published if tag in tags)


def test_a_removed_instance_exports_nothing_and_its_id_registered_again_starts_from_zero(
    http, instance, runtime, other_container
):
    write(http, [1, 2, 3])
    http("getCacheLocation", {"instance_id": "i1", "query_type": "QT_PREFIX_MATCH", "block_keys": [1, 2]})
    runtime.usage_metrics.run()
    # another container's series of the instance, already published, go too
    other_container.metrics.incr("manager.get_cache_location_hit_block_counter", 5, {"instance_id": "i1"})
    other_container.metrics_publisher.publish()
    assert "cache_manager_instance.byte_size" in _series_of(_published(runtime), ("instance_id", "i1"))

    assert code(http("removeInstance", {"instance_id": "i1", "instance_group": "g1"})) == "OK"
    assert _series_of(_published(runtime), ("instance_id", "i1")) == []
    runtime.usage_metrics.run()
    assert _series_of(_published(runtime), ("instance_id", "i1")) == []

    register(http)
    http("getCacheLocation", {"instance_id": "i1", "query_type": "QT_PREFIX_MATCH", "block_keys": [7]})
    published = _published(runtime)
    assert published[("manager.get_cache_location_query_block_counter", (("instance_id", "i1"),))] == 1
    assert published[("manager.get_cache_location_hit_block_counter", (("instance_id", "i1"),))] == 0


def test_a_new_group_has_its_usage_series_at_once_and_a_removed_one_none(http, runtime, nfs_root):
    nfs_root.mkdir()
    http("addStorage", {"storage": {"global_unique_name": "nfs_01", "nfs": {"root_path": str(nfs_root)}}})
    group = {"name": "fresh", "storage_candidates": ["nfs_01"], "quota": {"capacity": 1 << 20}}
    assert code(http("createInstanceGroup", {"instance_group": group})) == "OK"
    tags = (("instance_group", "fresh"),)
    assert _published(runtime)[("cache_manager_group.usage_ratio", tags)] == 0.0
    assert code(http("removeInstanceGroup", {"name": "fresh"})) == "OK"
    assert ("cache_manager_group.usage_ratio", tags) not in _published(runtime)


def test_expired_write_sessions_are_counted(http, instance, runtime, clock):
    for key in (1, 2):
        assert code(http("startWriteCache", {"instance_id": "i1", "block_keys": [key, key + 10]})) == "OK"
    clock.advance(3600)
    cloudwatch = io.StringIO()
    runtime.emf = EmfWriter("KVCM/test", clock, cloudwatch)
    assert runtime.session_reaper.expire_write_sessions() == {"expired": 2, "blocks": 4}
    published = _published(runtime)
    assert published[("write_session.expired_count", ())] == 2
    assert published[("write_session.expired_block_count", ())] == 4
    assert json.loads(cloudwatch.getvalue())["ExpiredWriteSessions"] == 2


def test_valkey_memory_and_the_rounds_last_times_are_gauges(http, instance, runtime, clock):
    runtime.usage_metrics.run()
    runtime.reclaim_job.run()
    runtime.health_checks.run_health_checks()
    published = _published(runtime)
    assert published[("valkey.used_memory_bytes", ())] > 0
    assert ("valkey.maxmemory_bytes", ()) in published
    assert published[("cache_reclaimer.last_round_time_s", ())] == clock.now()
    assert published[("data_storage.last_health_round_time_s", ())] == clock.now()


def test_every_job_counts_its_failures_and_records_its_last_success(http, instance, runtime, clock):
    from app import app
    from local_stack.scheduler import scheduled_event

    cloudwatch = io.StringIO()
    runtime.emf = EmfWriter("KVCM/test", clock, cloudwatch)
    app.handler_map["usage_metrics"](scheduled_event("usage_metrics", "us-east-1", clock), None)
    with pytest.raises(InstanceNotFoundError):
        app.handler_map["delete_batch"]({"instance_id": "gone", "victims": []}, None)
    published = _published(runtime)
    assert published[("job.last_success_time_s", (("job", "usage_metrics"),))] == clock.now()
    assert published[("job.failure_count", (("job", "delete_batch"),))] == 1
    assert ("job.last_success_time_s", (("job", "delete_batch"),)) not in published
    # the same in CloudWatch, for the template's alarms
    lines = [json.loads(line) for line in cloudwatch.getvalue().splitlines()]
    assert [(d["Job"], d.get("JobSuccesses"), d.get("JobFailures")) for d in lines] == [
        ("usage_metrics", 1, None),
        ("delete_batch", None, 1),
    ]
