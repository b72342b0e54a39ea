"""Watermark math: triggers, steps, per-type quotas, key counts, pressure, the split."""

import pytest

from chalicelib.capacity.watermark import Limits, Need, Plan, assess, own_needs, split
from chalicelib.control.groups import normalize_group
from chalicelib.index import Usage
from chalicelib.protocol.models import InstanceGroup

KIB = 1024


def usage(bytes_=0, keys=0, **by_type):
    return Usage(bytes_, keys, dict(by_type))


def test_under_the_trigger_nothing_is_planned():
    limits = Limits(capacity=1000, used_fraction=0.9)
    assert not assess(limits, {"a": usage(900)}).needed
    assert assess(limits, {"a": usage(901)}).bytes == 1


def test_the_trigger_is_not_fooled_by_floating_point():
    assert Limits(used_fraction=0.29).trigger(100) == 29
    assert Limits(used_fraction=0.9).trigger(1001) == 900


def test_a_round_frees_the_excess_bounded_by_the_step_percentage_and_size():
    usages = {"a": usage(600), "b": usage(300)}
    # 900 used, trigger 500: 400 over, but one step is 10 % of 1000
    assert assess(Limits(capacity=1000, used_fraction=0.5, step_percentage=10), usages).bytes == 100
    assert assess(Limits(capacity=1000, used_fraction=0.5, step_percentage=100), usages).bytes == 400
    assert assess(Limits(capacity=1000, used_fraction=0.5, step_percentage=100, step_size=30), usages).bytes == 30


def test_used_size_triggers_with_or_without_a_capacity():
    # no capacity: used_size is the trigger and the step's reference
    assert assess(Limits(used_size=500, step_percentage=10), {"a": usage(800)}).bytes == 50
    # both: whichever is lower triggers
    assert (
        assess(Limits(capacity=1000, used_fraction=0.9, used_size=500, step_percentage=100), {"a": usage(800)}).bytes
        == 300
    )
    # neither: no byte watermark at all
    assert not assess(Limits(), {"a": usage(10**12)}).needed


def test_per_type_quota_is_watched_on_its_own():
    limits = Limits(capacity=10_000, type_capacity={"ST_NFS": 400}, used_fraction=0.9, step_percentage=100)
    plan = assess(limits, {"a": usage(390, ST_NFS=300, ST_S3=90), "b": usage(60, ST_NFS=60)})
    # the total (450 of 10,000) is fine; NFS holds 360 of 400 with a trigger at 360
    assert plan == Plan(0, {}, {})
    plan = assess(limits, {"a": usage(400, ST_NFS=310, ST_S3=90), "b": usage(60, ST_NFS=60)})
    assert (plan.bytes, dict(plan.by_type)) == (0, {"ST_NFS": 10})


def test_key_count_watermark_is_per_instance():
    limits = Limits(max_keys=100, used_fraction=0.9, step_percentage=10)
    plan = assess(limits, {"a": usage(keys=95), "b": usage(keys=50), "c": usage(keys=100)})
    assert dict(plan.keys) == {"a": 5, "c": 10}
    # the step bounds blocks too
    assert dict(assess(limits, {"a": usage(keys=100)}).keys) == {"a": 10}


def test_pressure_makes_one_step_of_headroom_under_the_hard_limits():
    limits = Limits(capacity=1000, type_capacity={"ST_NFS": 500}, max_keys=10, used_fraction=1.0, step_percentage=10)
    full = {"a": usage(1000, keys=10, ST_NFS=500)}
    assert not assess(limits, full).needed  # a watermark of 100 % is never exceeded
    plan = assess(limits, full, pressure=True)
    assert (plan.bytes, dict(plan.by_type), dict(plan.keys)) == (100, {"ST_NFS": 50}, {"a": 1})
    # with enough headroom already, pressure changes nothing
    assert not assess(limits, {"a": usage(850, keys=5, ST_NFS=400)}, pressure=True).needed


def test_pressure_headroom_is_one_step_but_never_more_than_a_tenth():
    big_steps = Limits(capacity=1000, used_fraction=1.0, step_percentage=100)
    assert assess(big_steps, {"a": usage(1000)}, pressure=True).bytes == 100
    small_steps = Limits(capacity=1000, used_fraction=1.0, step_percentage=100, step_size=30)
    assert assess(small_steps, {"a": usage(1000)}, pressure=True).bytes == 30
    # a lower trigger stays the trigger
    low = Limits(capacity=1000, used_fraction=0.5, step_percentage=100)
    assert assess(low, {"a": usage(600)}, pressure=True).bytes == 100


def test_limits_of_a_stored_group():
    group = normalize_group(
        InstanceGroup.model_validate(
            {
                "name": "g",
                "storage_candidates": ["s"],
                "quota": {
                    "capacity": 64 * KIB,
                    "quota_config": [
                        {"storage_type": "ST_NFS", "capacity": 8 * KIB},
                        {"storage_type": "ST_S3", "capacity": 0},
                    ],
                },
                "cache_config": {
                    "reclaim_strategy": {
                        "trigger_strategy": {"used_percentage": 0.5, "used_size": 9},
                        "reclaim_step_size": 7,
                        "reclaim_step_percentage": 20,
                    },
                    "meta_indexer_config": {"max_key_count": 100},
                },
            }
        )
    )
    assert Limits.of(group) == Limits(
        capacity=64 * KIB,
        type_capacity={"ST_NFS": 8 * KIB},
        max_keys=100,
        used_fraction=0.5,
        used_size=9,
        step_size=7,
        step_percentage=20,
    )
    bare = InstanceGroup(name="g")
    assert Limits.of(bare) == Limits()


def test_split_is_proportional_to_usage_and_covers_the_plan():
    plan = Plan(100, {"ST_NFS": 30}, {"b": 2})
    usages = {"a": usage(600, ST_NFS=10), "b": usage(300, ST_NFS=20), "c": usage(0)}
    needs = split(plan, usages)
    assert needs == {"a": Need(67, {"ST_NFS": 10}, 0), "b": Need(34, {"ST_NFS": 20}, 2)}
    assert sum(n.bytes for n in needs.values()) >= plan.bytes


def test_an_even_split_gives_every_holder_the_same_share():
    plan = Plan(90, {"ST_NFS": 30}, {"b": 2})
    usages = {"a": usage(600, ST_NFS=10), "b": usage(300, ST_NFS=20), "c": usage(20), "d": usage(0)}
    needs = split(plan, usages, even=True)
    # 90 bytes over the 3 instances holding any (c holds only 20); 30 of ST_NFS over its 2 holders
    assert needs == {"a": Need(30, {"ST_NFS": 10}, 0), "b": Need(30, {"ST_NFS": 15}, 2), "c": Need(20, {}, 0)}


def test_own_needs_are_the_per_instance_part_alone():
    plan = Plan(500, {"ST_NFS": 30}, keys={"a": 3}, instance_bytes={"b": 40}, over_share={"b": 40})
    assert own_needs(plan) == {"a": Need(0, {}, 3), "b": Need(40, {}, 0)}


def test_split_never_asks_more_than_an_instance_holds():
    needs = split(Plan(1000), {"a": usage(5), "b": usage(3)})
    assert (needs["a"].bytes, needs["b"].bytes) == (5, 3)


def test_live_usage_leaves_out_what_is_already_being_deleted():
    deleting = dict(deleting_bytes=300, deleting_keys=3, deleting_by_type={"ST_NFS": 300})
    assert Usage(1000, 10, {"ST_NFS": 800, "ST_S3": 200}, **deleting).live() == usage(700, 7, ST_NFS=500, ST_S3=200)
    assert Usage(100, 1, {"ST_NFS": 100}, **deleting).live() == usage(0, 0, ST_NFS=0)


@pytest.mark.parametrize(
    "need, storage_type, wanted",
    [
        (Need(bytes=1), "ST_S3", True),
        (Need(keys=1), "ST_S3", True),
        (Need(by_type={"ST_NFS": 1}), "ST_NFS", True),
        (Need(by_type={"ST_NFS": 1}), "ST_S3", False),
        (Need(), "ST_NFS", False),
    ],
)
def test_need_wants_only_blocks_that_help(need, storage_type, wanted):
    assert need.wants(storage_type) is wanted


def test_need_take_and_block_estimate():
    need = Need(bytes=5000, by_type={"ST_NFS": 9000}, keys=2)
    assert need.blocks(2048) == 5  # the largest byte need, in blocks
    need.take(2048, "ST_NFS")
    need.take(2048, "ST_S3")
    assert need == Need(904, {"ST_NFS": 6952}, 0)
    assert need.pending
    for _ in range(4):
        need.take(2048, "ST_NFS")
    assert not need.pending and need == Need(0, {"ST_NFS": 0}, 0)


def test_used_percentage_above_one_never_triggers_even_under_pressure():
    """Upstream's reclaim cases switch percentage reclaim off with 3.2: a full group then
    refuses writes instead of reclaiming."""
    off = Limits(capacity=1000, type_capacity={"ST_NFS": 500}, max_keys=10, used_fraction=3.2, step_percentage=10)
    full = {"a": usage(1000, keys=10, ST_NFS=500)}
    assert not assess(off, full).needed
    assert not assess(off, full, pressure=True).needed
    assert (
        Limits.of(
            normalize_group(
                InstanceGroup.model_validate(
                    {
                        "name": "g",
                        "storage_candidates": ["a"],
                        "cache_config": {"reclaim_strategy": {"trigger_strategy": {"used_percentage": 3.2}}},
                    }
                )
            )
        ).used_fraction
        == 3.2
    )
