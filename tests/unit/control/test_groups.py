"""Instance group validation and defaults (pure functions)."""

import pytest

from chalicelib.control.groups import MAX_STORAGE_CANDIDATES, normalize_group
from chalicelib.protocol.codes import ReclaimPolicy, StorageType
from chalicelib.protocol.errors import InvalidArgumentError
from chalicelib.protocol.models import InstanceGroup


def group(**fields) -> InstanceGroup:
    return InstanceGroup.model_validate({"name": "g", "storage_candidates": ["nfs1"], **fields})


def test_missing_optional_parts_get_documented_defaults():
    g = normalize_group(group())
    reclaim = g.cache_config.reclaim_strategy
    assert reclaim.reclaim_policy == ReclaimPolicy.POLICY_LRU
    assert reclaim.trigger_strategy.used_percentage == 0.9
    assert reclaim.trigger_period_seconds == 10
    assert reclaim.reclaim_step_percentage == 10
    assert reclaim.delay_before_delete_ms == 0
    assert g.quota.capacity == 0 and g.quota.quota_config == []
    assert g.cache_config.meta_indexer_config.max_key_count == 0
    assert g.global_quota_group_name == "g"
    assert g.max_instance_count == 0


def test_given_values_are_kept_and_the_input_is_not_mutated():
    original = group(
        global_quota_group_name="shared",
        max_instance_count=3,
        quota={"capacity": 1000, "quota_config": [{"storage_type": "ST_NFS", "capacity": 10}]},
        cache_config={
            "reclaim_strategy": {
                "reclaim_policy": "POLICY_LFU",
                "trigger_period_seconds": 3,
                "trigger_strategy": {"used_percentage": 0.5},
                "reclaim_step_percentage": 25,
                "delay_before_delete_ms": 7,
            }
        },
    )
    g = normalize_group(original)
    reclaim = g.cache_config.reclaim_strategy
    assert (
        reclaim.reclaim_policy,
        reclaim.trigger_period_seconds,
        reclaim.reclaim_step_percentage,
        reclaim.delay_before_delete_ms,
        reclaim.trigger_strategy.used_percentage,
    ) == (ReclaimPolicy.POLICY_LFU, 3, 25, 7, 0.5)
    assert g.quota.quota_config[0].storage_type == StorageType.ST_NFS
    assert g.global_quota_group_name == "shared" and g.max_instance_count == 3
    assert original.cache_config.reclaim_strategy.trigger_strategy.used_percentage == 0.5
    assert original.cache_config.meta_indexer_config is None


def test_used_percentage_above_one_is_kept():
    """Above 1 never triggers: upstream's reclaim cases create their groups with 3.2."""
    g = normalize_group(
        InstanceGroup.model_validate(
            {
                "name": "g",
                "storage_candidates": ["a"],
                "cache_config": {"reclaim_strategy": {"trigger_strategy": {"used_percentage": 3.2}}},
            }
        )
    )
    assert g.cache_config.reclaim_strategy.trigger_strategy.used_percentage == 3.2


@pytest.mark.parametrize(
    "fields, path",
    [
        ({"name": ""}, "instance_group.name"),
        ({"storage_candidates": []}, "instance_group.storage_candidates"),
        ({"storage_candidates": ["a", ""]}, "instance_group.storage_candidates[1]"),
        ({"storage_candidates": ["a", "a"]}, "instance_group.storage_candidates[1]"),
        (
            {"storage_candidates": [f"s{i}" for i in range(MAX_STORAGE_CANDIDATES + 1)]},
            "instance_group.storage_candidates",
        ),
        ({"max_instance_count": -1}, "instance_group.max_instance_count"),
        ({"version": -2}, "instance_group.version"),
        ({"quota": {"capacity": -1}}, "instance_group.quota.capacity"),
        ({"quota": {"quota_config": [{"capacity": 5}]}}, "instance_group.quota.quota_config[0].storage_type"),
        (
            {"quota": {"quota_config": [{"storage_type": "ST_S3", "capacity": -5}]}},
            "instance_group.quota.quota_config[0].capacity",
        ),
        (
            {"quota": {"quota_config": [{"storage_type": "ST_S3"}, {"storage_type": "ST_S3"}]}},
            "instance_group.quota.quota_config[1]",
        ),
        (
            {"cache_config": {"reclaim_strategy": {"trigger_strategy": {"used_percentage": float("inf")}}}},
            "instance_group.cache_config.reclaim_strategy.trigger_strategy.used_percentage",
        ),
        (
            {"cache_config": {"reclaim_strategy": {"trigger_strategy": {"used_percentage": -0.1}}}},
            "instance_group.cache_config.reclaim_strategy.trigger_strategy.used_percentage",
        ),
        (
            {"cache_config": {"reclaim_strategy": {"trigger_strategy": {"used_size": -1}}}},
            "instance_group.cache_config.reclaim_strategy.trigger_strategy.used_size",
        ),
        (
            {"cache_config": {"reclaim_strategy": {"trigger_period_seconds": -1}}},
            "instance_group.cache_config.reclaim_strategy.trigger_period_seconds",
        ),
        (
            {"cache_config": {"reclaim_strategy": {"reclaim_step_percentage": 101}}},
            "instance_group.cache_config.reclaim_strategy.reclaim_step_percentage",
        ),
        (
            {"cache_config": {"reclaim_strategy": {"reclaim_step_size": -1}}},
            "instance_group.cache_config.reclaim_strategy.reclaim_step_size",
        ),
        (
            {"cache_config": {"reclaim_strategy": {"delay_before_delete_ms": -1}}},
            "instance_group.cache_config.reclaim_strategy.delay_before_delete_ms",
        ),
        (
            {"cache_config": {"reclaim_strategy": {"ttl_seconds": -1}}},
            "instance_group.cache_config.reclaim_strategy.ttl_seconds",
        ),
        (
            {"cache_config": {"reclaim_strategy": {"storage_unique_name": "elsewhere"}}},
            "instance_group.cache_config.reclaim_strategy.storage_unique_name",
        ),
        (
            {"cache_config": {"meta_indexer_config": {"max_key_count": -1}}},
            "instance_group.cache_config.meta_indexer_config.max_key_count",
        ),
    ],
)
def test_invalid_values_are_refused_naming_the_field(fields, path):
    with pytest.raises(InvalidArgumentError) as err:
        normalize_group(group(**fields))
    assert f"field '{path}'" in str(err.value)


def test_absent_group_is_required():
    with pytest.raises(InvalidArgumentError, match="field 'instance_group' is required"):
        normalize_group(None)
