"""startWriteCache §2.6 on real Valkey and moto: min_replica_count, the spec-group-aware
skip, stale-location pruning and the response mask (docs/api-v2.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chalicelib.protocol.models import InstanceGroup, StorageConfig

from .harness import ER_SPECS, code

GROUPS = [{"name": "F0", "spec_names": ["full_0"]}, {"name": "L0", "spec_names": ["linear_0"]}]


@pytest.fixture
def two_storages(runtime, http, tmp_path):
    """Instance r1 in group g2, which writes to nfs_a, then nfs_b (one block per file)."""
    for name in ("nfs_a", "nfs_b"):
        (tmp_path / name).mkdir()
        runtime.control.add_storage(
            StorageConfig.model_validate(
                {"global_unique_name": name, "nfs": {"root_path": str(tmp_path / name), "key_count_per_file": 1}}
            )
        )
    runtime.control.create_group(
        InstanceGroup.model_validate(
            {"name": "g2", "storage_candidates": ["nfs_a", "nfs_b"], "quota": {"capacity": 1 << 30}}
        )
    )
    resp = http(
        "registerInstance",
        {
            "instance_group": "g2",
            "instance_id": "r1",
            "block_size": 4,
            "location_spec_infos": ER_SPECS,
            "location_spec_groups": GROUPS,
            "model_deployment": {"model_name": "m", "dtype": "fp16"},
        },
    )
    assert code(resp) == "OK", resp
    return "r1"


def start(http, keys, **extra):
    resp = http("startWriteCache", {"instance_id": "r1", "block_keys": keys, **extra})
    assert code(resp) == "OK", resp
    return resp


def finish(http, started) -> None:
    resp = http(
        "finishWriteCache",
        {
            "instance_id": "r1",
            "write_session_id": started["write_session_id"],
            "success_blocks": {"offset": len(started["locations"])},
        },
    )
    assert code(resp) == "OK", resp


def engine_writes(started) -> list[Path]:
    """Write every block's data where the locations say (what the engine does); returns the files."""
    files = []
    for location in started["locations"]:
        for spec in location["location_specs"]:
            path_part, _, query = spec["uri"].partition("?")
            params = dict(p.split("=") for p in query.split("&"))
            path = Path("/" + path_part.split("://", 1)[1].split("/", 1)[1])
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x" * (int(params.get("blkid", 0)) + 1) * int(params["size"]))
            files.append(path)
    return files


def storages(started) -> list[str]:
    return [loc["location_specs"][0]["uri"].split("://", 1)[1].split("/", 1)[0] for loc in started["locations"]]


def test_min_replica_count_adds_a_location_on_the_next_storage(http, two_storages):
    finish(http, start(http, [1, 2]))
    more = start(http, [1, 2, 3], min_replica_count=2)
    assert storages(more) == ["nfs_b", "nfs_b", "nfs_a"] and more["block_mask"] == {"offset": 0}
    finish(http, more)
    again = start(http, [1, 2, 3], min_replica_count=2)  # key 3 was new: it has one location
    assert storages(again) == ["nfs_b"] and again["block_mask"] == {"offset": 2}
    finish(http, again)
    assert start(http, [1, 2, 3], min_replica_count=2)["block_mask"] == {"offset": 3}
    # A third location would need a third storage: nothing is written.
    third = start(http, [1, 2, 3], min_replica_count=3)
    assert third["locations"] == [] and third["block_mask"] == {"offset": 3}
    assert len(start(http, [1, 2, 3])["locations"]) == 0


def test_written_keys_not_a_suffix_get_a_bool_mask(http, two_storages):
    finish(http, start(http, [1, 3]))
    resp = start(http, [1, 2, 3, 4])
    assert resp["block_mask"] == {"bool_masks": {"values": [True, False, True, False]}} and len(resp["locations"]) == 2


def test_a_location_counts_only_for_spec_groups_it_covers(http, two_storages):
    finish(http, start(http, [5], location_spec_group_names=["F0"]))
    mamba = start(http, [5], location_spec_group_names=["L0"])
    assert [s["name"] for s in mamba["locations"][0]["location_specs"]] == ["linear_0"]
    finish(http, mamba)
    assert start(http, [5], location_spec_group_names=["F0"])["locations"] == []
    assert start(http, [5], location_spec_group_names=["L0"])["locations"] == []
    whole = start(http, [5])  # no single location holds both specs
    assert len(whole["locations"]) == 1 and whole["locations"][0]["spec_size"] == 2


def test_stale_locations_are_pruned_and_rewritten(http, two_storages, runtime):
    """upstream's location_pruning_test: A..E written, B..E's data lost."""
    runtime.reconfigure(prune_stale_on_write=True)
    keys = [11, 12, 13, 14, 15]
    written = start(http, keys)
    files = engine_writes(written)
    finish(http, written)
    for path in files[2:]:  # B..E (two spec files each)
        path.unlink()
    rewrite = start(http, keys)
    assert len(rewrite["locations"]) == 4 and rewrite["block_mask"] == {"offset": 1}
    engine_writes(rewrite)
    finish(http, rewrite)
    ctx = runtime.contexts("r1")
    usage = runtime.index.usage([ctx.layout])[0]
    assert usage.keys == 5 and usage.bytes == 5 * 1280 and usage.deleting_keys == 0  # the stale ones dropped
    assert start(http, keys)["locations"] == []

    lost = [21, 22, 23, 24, 25]
    written = start(http, lost)
    files = engine_writes(written)
    finish(http, written)
    for path in files[2:4] + files[6:8]:  # B and D
        path.unlink()
    rewrite = start(http, lost)
    assert len(rewrite["locations"]) == 2
    assert rewrite["block_mask"] == {"bool_masks": {"values": [True, False, True, False, True]}}


def test_without_pruning_a_key_with_lost_data_is_not_rewritten(http, two_storages):
    written = start(http, [31, 32])
    finish(http, written)  # no data written at all
    assert start(http, [31, 32])["locations"] == []


@pytest.mark.parametrize("value", [-1, -5])
def test_a_negative_min_replica_count_changes_nothing(http, two_storages, runtime, value):
    ctx = runtime.contexts("r1")
    before = runtime.index.usage([ctx.layout])[0]
    resp = http("startWriteCache", {"instance_id": "r1", "block_keys": [41], "min_replica_count": value})
    assert code(resp) == "INVALID_ARGUMENT" and "'min_replica_count'" in resp["header"]["status"]["message"]
    assert runtime.index.usage([ctx.layout])[0] == before
    assert http("getCacheMeta", {"instance_id": "r1", "block_keys": [41]})["metas"] == [
        '{"id": "", "status": "CLS_NOT_FOUND"}'
    ]
