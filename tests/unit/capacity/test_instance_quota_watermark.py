"""The reclaimer's watermark with per-instance quotas: an instance over its own trigger is
reclaimed on its own, and gives first when the group is over."""

from chalicelib.capacity.watermark import Limits, assess, split
from chalicelib.control.groups import normalize_group
from chalicelib.index import Usage
from chalicelib.protocol.models import InstanceGroup


def usage(bytes_: int) -> Usage:
    return Usage(bytes_, 0, {})


def test_limits_read_the_instance_quotas():
    g = normalize_group(
        InstanceGroup.model_validate(
            {
                "name": "g",
                "storage_candidates": ["s"],
                "quota": {"capacity": 1000},
                "instance_quotas": {"a": 600, "b": 400},
            }
        )
    )
    assert Limits.of(g).instance_capacity == {"a": 600, "b": 400}


def test_an_instance_over_its_own_trigger_is_reclaimed_though_the_group_is_under():
    limits = Limits(capacity=1000, used_fraction=0.5, step_percentage=100, instance_capacity={"a": 200, "b": 800})
    usages = {"a": usage(300), "b": usage(100)}  # 400 of the group's trigger 500; a is 200 over its 100
    plan = assess(limits, usages)
    assert plan.bytes == 0 and plan.instance_bytes == {"a": 200} and plan.needed
    needs = split(plan, usages)
    assert set(needs) == {"a"} and needs["a"].bytes == 200


def test_the_group_excess_comes_first_from_the_instances_over_their_share():
    limits = Limits(capacity=1000, used_fraction=1.0, step_percentage=100, instance_capacity={"a": 300, "b": 700})
    usages = {"a": usage(500), "b": usage(600)}  # group 100 over; a 200 over its share, b under
    plan = assess(limits, usages)
    assert plan.bytes == 100 and plan.over_share == {"a": 200}
    needs = split(plan, usages)
    assert needs["a"].bytes == 200 and "b" not in needs  # a's own excess covers the group's
    # without instance quotas the same excess is spread by usage
    plain = split(assess(Limits(capacity=1000, used_fraction=1.0, step_percentage=100), usages), usages)
    assert plain["a"].bytes == 46 and plain["b"].bytes == 55


def test_the_group_excess_beyond_the_over_shares_is_spread_by_usage():
    limits = Limits(capacity=1000, used_fraction=1.0, step_percentage=100, instance_capacity={"a": 450})
    usages = {"a": usage(500), "b": usage(700)}  # group 200 over; a 50 over its own
    needs = split(assess(limits, usages), usages)
    # a: its 50 first, then 150 by usage: a 150 * 500/1200 = 63, b 150 * 700/1200 = 88
    assert needs["a"].bytes == 50 + 63 and needs["b"].bytes == 88
