"""``cache_config.reclaim_strategy.instance_reclaim_budget_policy`` over HTTP: its default,
the names and numbers accepted, and bad values refused naming the field with nothing changed."""

from __future__ import annotations

import pytest

from tests.integration.control.harness import add_storages, call, code, group_json, message

FIELD = "instance_group.cache_config.reclaim_strategy.instance_reclaim_budget_policy"


def strategy(**fields) -> dict:
    return {"cache_config": {"reclaim_strategy": fields}}


def stored_policy(client, name: str = "g1") -> str:
    group = call(client, "getInstanceGroup", {"name": name})["instance_group"]
    return group["cache_config"]["reclaim_strategy"]["instance_reclaim_budget_policy"]


@pytest.mark.parametrize(
    "fields, stored",
    [
        ({}, "GROUP_LRU"),  # absent: the default
        ({"reclaim_policy": "POLICY_LRU"}, "GROUP_LRU"),
        ({"reclaim_policy": "POLICY_LFU"}, "USAGE_PROPORTIONAL"),  # GROUP_LRU cannot order by counters
        ({"reclaim_policy": "POLICY_TTL", "ttl_seconds": 60}, "USAGE_PROPORTIONAL"),
        ({"instance_reclaim_budget_policy": "USAGE_PROPORTIONAL"}, "USAGE_PROPORTIONAL"),
        ({"instance_reclaim_budget_policy": 1}, "FIXED_PER_INSTANCE"),
        ({"instance_reclaim_budget_policy": "2", "reclaim_policy": "POLICY_LRU"}, "GROUP_LRU"),
        (
            {"instance_reclaim_budget_policy": "FIXED_PER_INSTANCE", "reclaim_policy": "POLICY_LFU"},
            "FIXED_PER_INSTANCE",
        ),
    ],
)
def test_the_policy_is_stored_with_its_default_filled_in(client, fields, stored, control):
    add_storages(control)
    assert code(call(client, "createInstanceGroup", {"instance_group": group_json("g1", **strategy(**fields))})) == "OK"
    assert stored_policy(client) == stored


@pytest.mark.parametrize(
    "fields, named",
    [
        ({"instance_reclaim_budget_policy": "GROUP_LRU", "reclaim_policy": "POLICY_LFU"}, FIELD),
        ({"instance_reclaim_budget_policy": 2, "reclaim_policy": "POLICY_TTL", "ttl_seconds": 60}, FIELD),
        ({"instance_reclaim_budget_policy": "OLDEST_FIRST"}, "instance_reclaim_budget_policy"),
        ({"instance_reclaim_budget_policy": 7}, "instance_reclaim_budget_policy"),
        ({"instance_reclaim_budget_policy": True}, "instance_reclaim_budget_policy"),
    ],
)
def test_bad_values_are_refused_naming_the_field_and_nothing_changes(client, fields, named, control):
    add_storages(control)
    assert (
        code(
            call(
                client,
                "createInstanceGroup",
                {"instance_group": group_json("g1", **strategy(instance_reclaim_budget_policy="USAGE_PROPORTIONAL"))},
            )
        )
        == "OK"
    )
    before = call(client, "getInstanceGroup", {"name": "g1"})["instance_group"]
    updated = call(
        client, "updateInstanceGroup", {"current_version": 1, "instance_group": group_json("g1", **strategy(**fields))}
    )
    assert code(updated) == "INVALID_ARGUMENT" and named in message(updated), message(updated)
    assert call(client, "getInstanceGroup", {"name": "g1"})["instance_group"] == before
    created = call(client, "createInstanceGroup", {"instance_group": group_json("g2", **strategy(**fields))})
    assert code(created) == "INVALID_ARGUMENT" and named in message(created), message(created)
    assert code(call(client, "getInstanceGroup", {"name": "g2"})) == "INVALID_ARGUMENT"  # not created
