"""getInstanceGroupUsage against the local stack: quota, watermark and the instances' shares."""

from __future__ import annotations

from chalicelib.protocol import models as m
from chalicelib.protocol.codes import ErrorCode, StorageType
from kvcm_client import KvcmClient, KvcmError
from local_stack import LocalStack

SPEC_BYTES = 1024


def write(client: KvcmClient, instance_id: str, keys: list[int], group: str = "usage") -> None:
    client.register_instance(
        instance_group=group,
        instance_id=instance_id,
        block_size=16,
        location_spec_infos=[m.LocationSpecInfo(name="tp0", size=SPEC_BYTES)],
        model_deployment=m.ModelDeployment(model_name="qwen", dtype="bf16"),
    )
    session = client.start_write_cache(instance_id=instance_id, block_keys=keys).write_session_id
    client.finish_write_cache(
        instance_id=instance_id, write_session_id=session, success_blocks=m.BlockMask(offset=len(keys))
    )


def test_usage_of_a_group_against_its_quota_and_watermark(stack: LocalStack):
    with KvcmClient(stack.api_url) as client:
        client.create_instance_group(
            instance_group=m.InstanceGroup(
                name="usage",
                storage_candidates=["nfs_01"],
                quota=m.InstanceGroupQuota(
                    capacity=100 * SPEC_BYTES,
                    quota_config=[m.QuotaConfig(storage_type=StorageType.ST_NFS, capacity=50 * SPEC_BYTES)],
                ),
                cache_config=m.CacheConfig(
                    reclaim_strategy=m.CacheReclaimStrategy(trigger_strategy=m.TriggerStrategy(used_percentage=0.8))
                ),
            )
        )
        write(client, "usage-a", [1, 2, 3])
        write(client, "usage-b", [1, 2, 3, 4, 5])
        report = client.get_instance_group_usage(instance_group_name="usage").usage
        everything = client.get_instance_group_usage().usage
        unknown_group_code = None
        try:
            client.get_instance_group_usage(instance_group_name="no-such-group")
        except KvcmError as exc:
            unknown_group_code = exc.code
    assert [g.name for g in report] == ["usage"]
    group = report[0]
    assert (group.capacity, group.watermark_bytes) == (100 * SPEC_BYTES, 80 * SPEC_BYTES)
    assert (group.used_bytes, group.key_count) == (8 * SPEC_BYTES, 8)
    assert [(i.instance_id, i.used_bytes, i.key_count) for i in group.instances] == [
        ("usage-b", 5 * SPEC_BYTES, 5),
        ("usage-a", 3 * SPEC_BYTES, 3),
    ]
    assert [(t.storage_type, t.used_bytes, t.capacity, t.watermark_bytes) for t in group.by_storage_type] == [
        (StorageType.ST_NFS, 8 * SPEC_BYTES, 50 * SPEC_BYTES, 40 * SPEC_BYTES)
    ]
    assert {"default", "usage"} <= {g.name for g in everything}
    assert unknown_group_code == ErrorCode.INVALID_ARGUMENT


def test_reads_report_the_blocks_asked_and_found(stack: LocalStack):
    """The console's hit ratio: manager.prefix_match_len / manager.prefix_match_asked (means per read)."""
    with KvcmClient(stack.api_url) as client:
        write(client, "usage-reads", [11, 12, 13], group="default")
        client.get_cache_location(instance_id="usage-reads", query_type="QT_PREFIX_MATCH", block_keys=[11, 12, 99, 13])
        client.get_cache_location(
            instance_id="usage-reads",
            query_type="QT_PREFIX_MATCH",
            block_keys=[11, 12, 13, 14],
            block_mask=m.BlockMask(offset=2),
        )
        points = {
            p.metric_name: p.metric_value.float_value
            for p in client.get_metrics().metrics
            if [(t.tag_key, t.tag_value) for t in p.metric_tags] == [("instance_id", "usage-reads")]
        }
    # Read 1 asks 4 and finds 2 (stops at 99); read 2 asks the 2 unmasked and finds 1 (13).
    assert points["manager.prefix_match_asked"] == (4 + 2) / 2
    assert points["manager.prefix_match_len"] == (2 + 1) / 2
