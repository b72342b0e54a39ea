"""Health checks: a failing probe takes a storage out of service (writes fail over, reads
stop), with hysteresis, and it comes back once probes succeed again."""

import shutil

from chalicelib.clock import ManualClock
from chalicelib.protocol.models import (
    BlockMask,
    FinishWriteCacheRequest,
    GetCacheLocationRequest,
    InstanceGroup,
    StartWriteCacheRequest,
    StorageConfig,
)


def test_probe_failure_fails_over_and_recovers(stack, tmp_path):
    rt = stack.runtime
    backup = tmp_path / "backup"
    backup.mkdir()
    rt.control.add_storage(
        StorageConfig.model_validate(
            {"global_unique_name": "nfs_02", "nfs": {"root_path": str(backup), "key_count_per_file": 2}}
        )
    )
    group = rt.control.get_group("g1")
    rt.control.update_group(
        InstanceGroup.model_validate({**group.model_dump(), "version": 0, "storage_candidates": ["nfs_01", "nfs_02"]}),
        current_version=group.version,
    )
    rt.config.invalidate()
    start = rt.cache.start_write_cache(StartWriteCacheRequest(instance_id="i1", block_keys=[1]))
    rt.cache.finish_write_cache(
        FinishWriteCacheRequest(
            instance_id="i1", write_session_id=start.write_session_id, success_blocks=BlockMask(offset=1)
        )
    )
    assert start.locations[0]["location_specs"][0]["uri"].startswith("file://nfs_01/")

    rt.storage_prober.clock = ManualClock()  # the round's confirming probes wait on it
    shutil.rmtree(stack.root)  # the mount is gone: probes fail
    # One round: a failed probe is confirmed by a second one CONFIRM_DELAY_S later (hysteresis).
    report = rt.health_checks.run_health_checks()
    assert report["changes"] == [{"storage": "nfs_01", "available": False, "reason": report["changes"][0]["reason"]}]
    assert rt.metrics.value("data_storage.healthy_status", {"storage": "nfs_01"}) == 0
    rt.contexts.forget("i1")  # what config_refresh_s does in every container
    moved = rt.cache.start_write_cache(StartWriteCacheRequest(instance_id="i1", block_keys=[2]))
    assert moved.locations[0]["location_specs"][0]["uri"].startswith("file://nfs_02/")
    read = rt.cache.get_cache_location(GetCacheLocationRequest(instance_id="i1", query_type=2, block_keys=[1]))
    assert read.locations == []

    stack.root.mkdir()
    assert rt.health_checks.run_health_checks()["changes"][0]["available"] is True
    rt.contexts.forget("i1")
    read = rt.cache.get_cache_location(GetCacheLocationRequest(instance_id="i1", query_type=2, block_keys=[1]))
    assert len(read.locations) == 1


def test_scheduled_functions_apply_the_stored_log_level_and_publish_their_metrics(stack):
    """What ``@job`` adds around every scheduled and task function of the app."""
    from app import app
    from chalicelib.clock import SystemClock
    from chalicelib.observability.logging import logger
    from local_stack.scheduler import scheduled_event

    rt = stack.runtime
    level = logger.log_level
    try:
        rt.control.set_log_level("ERROR")
        logger.setLevel("INFO")  # this container started before the change
        app.handler_map["health_check"](scheduled_event("health_check", "us-east-1", SystemClock()), None)
        assert logger.log_level == 40
    finally:
        logger.setLevel(level)
    published = {(p.name, p.tags): p.value for p in rt.metrics_store.totals().points()}
    assert published[("data_storage.healthy_status", (("storage", "nfs_01"),))] == 1.0
