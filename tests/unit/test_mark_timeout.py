"""How long an admin Mark lasts: the route's mark timeout, else one into the target, else 24 h."""

from chalicelib.protocol.models import InstanceGroup
from chalicelib.services.migrations import mark_timeout_ms


def _group(*routes):
    strategies = [
        {
            "source_storage_name": source,
            "target_storage_name": target,
            "trigger_threshold": 0.8,
            "method_configs": {"mark": {"enabled": True, **({"timeout_ms": timeout} if timeout else {})}},
        }
        for source, target, timeout in routes
    ]
    return InstanceGroup.model_validate({"name": "g", "cache_config": {"migration_config": {"strategies": strategies}}})


def test_the_route_of_the_pair_wins_then_one_into_the_target_then_a_day():
    group = _group(("mem", "s3", 5_000), ("nfs", "s3", 7_000), ("nfs", "cold", None))
    assert mark_timeout_ms(group, "nfs", "s3") == 7_000
    assert mark_timeout_ms(group, "ssd", "s3") == 5_000
    assert mark_timeout_ms(group, "nfs", "cold") == 86_400_000
    assert mark_timeout_ms(InstanceGroup(name="bare"), "nfs", "s3") == 86_400_000
