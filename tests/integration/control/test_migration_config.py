"""``cache_config.migration_config`` (tiered storage, UPSTREAM_V2 §2.11) over HTTP: upstream's
rules, each refusal naming its field and writing nothing, defaults filled in, and the config
read back unchanged by getInstanceGroup and listInstanceGroup."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.integration.control.harness import add_storages, call, code, group_json, message, post, snapshot

PATH = "instance_group.cache_config.migration_config"


def strategy(**fields: Any) -> dict:
    """A valid hot -> cold strategy, ``fields`` replacing its own."""
    return {
        "source_storage_name": "hot",
        "target_storage_name": "cold",
        "trigger_threshold": 0.8,
        "method_configs": {"copy": {"enabled": True}, "mark": {"enabled": False, "timeout_ms": "86400000"}},
        "retention": "MIGRATION_RETENTION_DELETE_SOURCE",
        **fields,
    }


def tiered_group(migration: dict, name: str = "g1") -> dict:
    return group_json(name, "hot", "cold", "warm", cache_config={"migration_config": migration})


# (migration_config, the field the message must name, text it must contain)
MALFORMED = [
    ({"strategies": {}}, "strategies", ""),
    ({"strategies": [5]}, "strategies[0]", ""),
    ({"copy_max_concurrency": 0}, "copy_max_concurrency", "must be > 0"),
    ({"copy_max_concurrency": -3}, "copy_max_concurrency", "must be > 0"),
    ({"copy_max_concurrency": "two"}, "copy_max_concurrency", ""),
    ({"copy_max_concurrency": 2**31}, "copy_max_concurrency", ""),
    ({"mark_clear_policy": "MIGRATION_MARK_CLEAR_NEVER"}, "mark_clear_policy", "unknown"),
    ({"mark_clear_policy": 7}, "mark_clear_policy", "unknown"),
    ({"copy_execution_mode": "MIGRATION_COPY_EVENTUALLY"}, "copy_execution_mode", "unknown"),
    ({"copy_max_inflight_bytes": -1}, "copy_max_inflight_bytes", "must be >= 0"),
    ({"copy_max_quarantine_operations": -1}, "copy_max_quarantine_operations", "must be >= 0"),
    ({"copy_max_quarantine_bytes": "lots"}, "copy_max_quarantine_bytes", ""),
    (
        {"copy_execution_mode": "MIGRATION_COPY_ASYNC_REQUIRED"},
        "copy_max_inflight_bytes",
        "must be > 0 with copy_execution_mode MIGRATION_COPY_ASYNC_REQUIRED",
    ),
    (
        {
            "copy_execution_mode": "MIGRATION_COPY_ASYNC_REQUIRED",
            "copy_max_inflight_bytes": 1 << 30,
            "copy_max_quarantine_operations": 8,
        },
        "copy_max_quarantine_bytes",
        "must be > 0 with copy_execution_mode MIGRATION_COPY_ASYNC_REQUIRED",
    ),
    ({"copy_operation_deadline_ms": 0}, "copy_operation_deadline_ms", "must be > 0"),
    ({"copy_poll_initial_interval_ms": -5}, "copy_poll_initial_interval_ms", "must be > 0"),
    ({"copy_poll_initial_interval_ms": 2000}, "copy_poll_max_interval_ms", "must be >= copy_poll_initial_interval_ms"),
    ({"copy_poll_max_interval_ms": 600_000}, "copy_poll_max_interval_ms", "must be < copy_operation_deadline_ms"),
    ({"copy_connect_timeout_ms": 0}, "copy_connect_timeout_ms", "must be > 0"),
    ({"copy_connect_timeout_ms": 4000}, "copy_submit_timeout_ms", "must be >= copy_connect_timeout_ms"),
    (
        {"copy_connect_timeout_ms": 3500, "copy_submit_timeout_ms": 3500},
        "copy_query_timeout_ms",
        "must be >= copy_connect_timeout_ms",
    ),
    ({"copy_submit_timeout_ms": 0}, "copy_submit_timeout_ms", "must be > 0"),
    ({"copy_query_timeout_ms": "soon"}, "copy_query_timeout_ms", ""),
    (
        {"copy_operation_deadline_ms": 40_000},
        "copy_operation_deadline_ms",
        "must be >= 16 x max(copy_submit_timeout_ms, copy_query_timeout_ms) = 48000",
    ),
    ({"strategies": [strategy(source_storage_name="")]}, "strategies[0].source_storage_name", "is required"),
    ({"strategies": [strategy(source_storage_name=5)]}, "strategies[0].source_storage_name", ""),
    ({"strategies": [strategy(target_storage_name="")]}, "strategies[0].target_storage_name", "is required"),
    (
        {"strategies": [strategy(target_storage_name="elsewhere")]},
        "strategies[0].target_storage_name",
        "not one of the storage_candidates",
    ),
    (
        {"strategies": [strategy(source_storage_name="ghost")]},
        "strategies[0].source_storage_name",
        "not one of the storage_candidates",
    ),
    (
        {"strategies": [strategy(target_storage_name="hot")]},
        "strategies[0].target_storage_name",
        "must differ from source_storage_name",
    ),
    ({"strategies": [strategy(trigger_threshold=0)]}, "strategies[0].trigger_threshold", "(0, 1)"),
    ({"strategies": [strategy(trigger_threshold=1)]}, "strategies[0].trigger_threshold", "(0, 1)"),
    ({"strategies": [strategy(trigger_threshold=-0.2)]}, "strategies[0].trigger_threshold", "(0, 1)"),
    ({"strategies": [strategy(trigger_threshold="NaN")]}, "strategies[0].trigger_threshold", "(0, 1)"),
    ({"strategies": [strategy(trigger_threshold="high")]}, "strategies[0].trigger_threshold", ""),
    ({"strategies": [strategy(method_configs=None)]}, "strategies[0].method_configs", "must enable copy, mark"),
    (
        {"strategies": [strategy(method_configs={"copy": {"enabled": False}, "mark": {"enabled": False}})]},
        "strategies[0].method_configs",
        "must enable copy, mark",
    ),
    (
        {"strategies": [strategy(method_configs={"copy": {"enabled": "yes"}})]},
        "strategies[0].method_configs.copy.enabled",
        "",
    ),
    ({"strategies": [strategy(method_configs={"copy": []})]}, "strategies[0].method_configs.copy", ""),
    (
        {"strategies": [strategy(method_configs={"mark": {"enabled": True, "timeout_ms": 0}})]},
        "strategies[0].method_configs.mark.timeout_ms",
        "must be > 0",
    ),
    (
        {"strategies": [strategy(method_configs={"mark": {"enabled": True, "timeout_ms": "a day"}})]},
        "strategies[0].method_configs.mark.timeout_ms",
        "",
    ),
    (
        {"strategies": [strategy(retention="MIGRATION_RETENTION_UNSPECIFIED")]},
        "strategies[0].retention",
        "is required when copy is enabled",
    ),
    ({"strategies": [strategy(retention=None)]}, "strategies[0].retention", "is required when copy is enabled"),
    ({"strategies": [strategy(retention="MIGRATION_RETENTION_FOREVER")]}, "strategies[0].retention", "unknown"),
    (
        {"strategies": [strategy(), strategy(trigger_threshold=0.5)]},
        "strategies[1]",
        "repeats the route 'hot' -> 'cold'",
    ),
    (
        {"strategies": [strategy(demote_on_reclaim=True, method_configs={"mark": {"enabled": True}})]},
        "strategies[0].demote_on_reclaim",
        "needs method_configs.copy.enabled and retention MIGRATION_RETENTION_DELETE_SOURCE",
    ),
    (
        {"strategies": [strategy(demote_on_reclaim=True, retention="MIGRATION_RETENTION_KEEP_BOTH")]},
        "strategies[0].demote_on_reclaim",
        "needs method_configs.copy.enabled and retention MIGRATION_RETENTION_DELETE_SOURCE",
    ),
    (
        {
            "strategies": [
                strategy(demote_on_reclaim=True),
                strategy(target_storage_name="warm", source_storage_name="cold", demote_on_reclaim=True),
                strategy(source_storage_name="warm", target_storage_name="hot"),
                strategy(target_storage_name="warm", source_storage_name="hot", demote_on_reclaim=True),
            ]
        },
        "strategies[3].demote_on_reclaim",
        "strategies[0] demotes the victims of 'hot' already: one per source storage",
    ),
    ({"strategies": [strategy(demote_on_reclaim="sometimes")]}, "strategies[0].demote_on_reclaim", ""),
]


@pytest.fixture
def storages(control):
    add_storages(control, "hot", "cold", "warm")


@pytest.mark.parametrize(("migration", "field", "text"), MALFORMED)
def test_create_refuses_each_malformed_field_by_name(client, runtime, storages, migration, field, text):
    before = snapshot(runtime)
    status, data = post(client, "createInstanceGroup", {"instance_group": tiered_group(migration)})
    assert status == 200, data
    assert code(data) == "INVALID_ARGUMENT", data
    assert f"field '{PATH}.{field}" in message(data), message(data)
    assert text in message(data), message(data)
    assert snapshot(runtime) == before


@pytest.mark.parametrize(("migration", "field", "text"), MALFORMED[::4])
def test_update_refuses_malformed_fields_and_keeps_the_stored_config(client, storages, migration, field, text):
    call(client, "createInstanceGroup", {"instance_group": tiered_group({"strategies": [strategy()]})})
    stored = call(client, "getInstanceGroup", {"name": "g1"})["instance_group"]
    data = call(client, "updateInstanceGroup", {"instance_group": tiered_group(migration), "current_version": 1})
    assert code(data) == "INVALID_ARGUMENT" and f"field '{PATH}.{field}" in message(data), data
    assert call(client, "getInstanceGroup", {"name": "g1"})["instance_group"] == stored


def test_defaults_are_filled_in_and_read_back(client, storages):
    mark_only = {
        "sourceStorageName": "hot",
        "targetStorageName": "warm",
        "triggerThreshold": 0.9,
        "methodConfigs": {"mark": {"enabled": True}},
    }
    created = call(client, "createInstanceGroup", {"instance_group": tiered_group({"strategies": [mark_only]})})
    assert code(created) == "OK"
    migration = call(client, "getInstanceGroup", {"name": "g1"})["instance_group"]["cache_config"]["migration_config"]
    assert migration == {
        "strategies": [
            {
                "source_storage_name": "hot",
                "target_storage_name": "warm",
                "trigger_threshold": 0.9,
                "method_configs": {"copy": {"enabled": False}, "mark": {"enabled": True, "timeout_ms": "86400000"}},
                "retention": "MIGRATION_RETENTION_UNSPECIFIED",
                "demote_on_reclaim": False,
            }
        ],
        "copy_max_concurrency": 1,
        "mark_clear_policy": "MIGRATION_MARK_CLEAR_ON_NEXT_WRITE_SUCCESS",
        "copy_execution_mode": "MIGRATION_COPY_SYNC",
        "copy_max_inflight_bytes": "0",
        "copy_max_quarantine_operations": "0",
        "copy_max_quarantine_bytes": "0",
        "copy_operation_deadline_ms": "600000",
        "copy_poll_initial_interval_ms": "20",
        "copy_poll_max_interval_ms": "1000",
        "copy_connect_timeout_ms": "1000",
        "copy_submit_timeout_ms": "3000",
        "copy_query_timeout_ms": "3000",
    }


FULL = {
    "strategies": [
        strategy(demote_on_reclaim=True),
        strategy(
            source_storage_name="cold",
            target_storage_name="warm",
            trigger_threshold=0.25,
            method_configs={"copy": {"enabled": True}, "mark": {"enabled": True, "timeout_ms": "60000"}},
            retention="MIGRATION_RETENTION_KEEP_BOTH",
            demote_on_reclaim=False,
        ),
    ],
    "copy_max_concurrency": 4,
    "mark_clear_policy": "MIGRATION_MARK_CLEAR_ON_FULL_BLOCK_COVERED",
    "copy_execution_mode": "MIGRATION_COPY_ASYNC_REQUIRED",
    "copy_max_inflight_bytes": str(1 << 40),
    "copy_max_quarantine_operations": "16",
    "copy_max_quarantine_bytes": str(1 << 33),
    "copy_operation_deadline_ms": "120000",
    "copy_poll_initial_interval_ms": "50",
    "copy_poll_max_interval_ms": "2000",
    "copy_connect_timeout_ms": "500",
    "copy_submit_timeout_ms": "7000",
    "copy_query_timeout_ms": "7500",
}


def test_every_field_round_trips_through_create_update_get_and_list(client, storages):
    call(client, "createInstanceGroup", {"instance_group": tiered_group(FULL)})
    read = call(client, "getInstanceGroup", {"name": "g1"})["instance_group"]
    assert read["cache_config"]["migration_config"] == FULL
    # What an operator reads back is what it can send again.
    changed = copy.deepcopy(FULL)
    changed["copy_max_concurrency"] = 2
    read["cache_config"]["migration_config"] = changed
    read["version"] = 2
    assert code(call(client, "updateInstanceGroup", {"instance_group": read, "current_version": 1})) == "OK"
    (listed,) = call(client, "listInstanceGroup")["instance_group"]
    assert listed["cache_config"]["migration_config"] == changed
    # Numbers given as enum numbers and JSON numbers read back as names and strings.
    numeric = {**FULL, "mark_clear_policy": 1, "copy_execution_mode": 1, "copy_max_quarantine_operations": 16}
    numeric["strategies"] = [{**s, "retention": 1} for s in FULL["strategies"][:1]]
    call(client, "createInstanceGroup", {"instance_group": tiered_group(numeric, name="g2")})
    migration = call(client, "getInstanceGroup", {"name": "g2"})["instance_group"]["cache_config"]["migration_config"]
    assert migration == {**FULL, "strategies": FULL["strategies"][:1]}


def test_a_group_without_migration_config_has_none(client, storages):
    call(client, "createInstanceGroup", {"instance_group": group_json("g1", "hot")})
    assert "migration_config" not in call(client, "getInstanceGroup", {"name": "g1"})["instance_group"]["cache_config"]
