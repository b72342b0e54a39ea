"""Rendering index records as CacheLocation JSON (pure: fabricated records, no I/O)."""

import json
import struct

import pytest

from chalicelib.cache.context import InstanceContext, SpecLayout, StorageState, tier_depths
from chalicelib.cache.locations import ANY_STATUS, LocationRenderer
from chalicelib.index import InstanceLayout, Status
from chalicelib.protocol.models import InstanceGroup, LocationSpecGroup, LocationSpecInfo, StorageConfig
from chalicelib.storage.base import BlockRef
from chalicelib.storage.file import FileBackend, ThreeFSBackend

KEY = -5
NAMES = {1: "nfs_01", 2: "3fs_01", 3: "gone"}


def record(*locations) -> bytes:
    """Header then (status, storage index, spec group, location id, group id, slot) each."""
    head = struct.pack(">B8sHIBIHB", 0, bytes(8), 0, 0, 5, 0, 0, len(locations))
    return head + b"".join(
        struct.pack(">BBB", st, sidx, sg) + lid.to_bytes(5, "big") + gid.to_bytes(6, "big") + struct.pack(">H", slot)
        for st, sidx, sg, lid, gid, slot in locations
    )


@pytest.fixture
def context(tmp_path):
    def make(three_fs_available=True) -> InstanceContext:
        nfs = FileBackend(
            StorageConfig.model_validate(
                {"global_unique_name": "nfs_01", "nfs": {"root_path": str(tmp_path), "key_count_per_file": 4}}
            )
        )
        three = ThreeFSBackend(
            StorageConfig.model_validate(
                {"global_unique_name": "3fs_01", "threefs": {"mountpoint": str(tmp_path), "root_dir": "r"}}
            )
        )
        specs = SpecLayout(
            (LocationSpecInfo(name="tp0", size=16), LocationSpecInfo(name="tp1", size=32)),
            (LocationSpecGroup(name="only1", spec_names=["tp1"]),),
        )
        return InstanceContext(
            "i1",
            InstanceGroup(name="g"),
            4,
            specs,
            InstanceLayout("t", "i1", 4),
            (StorageState(nfs, True), StorageState(three, three_fs_available)),
        )

    return make


def render(ctx, raw, statuses=None, spec_names=None):
    renderer = LocationRenderer(ctx, NAMES.get, spec_names)
    text = renderer.render(KEY, raw, statuses) if statuses else renderer.render(KEY, raw)
    return json.loads(text) if text is not None else None


def uris(ctx, storage, spec_group, lid, gid, slot):
    backend = ctx.by_name[storage].backend
    slots = ctx.spec_layout.slots(spec_group)
    return [backend.uri(BlockRef("i1", KEY, lid, gid, slot, slots), s) for s in slots]


def test_one_serving_location(context):
    ctx = context()
    loc = render(ctx, record((Status.SERVING, 1, 0, 9, 8, 1)))
    assert (loc["type"], loc["spec_size"]) == ("ST_NFS", 2)
    assert [s["name"] for s in loc["location_specs"]] == ["tp0", "tp1"]
    assert [s["uri"] for s in loc["location_specs"]] == uris(ctx, "nfs_01", 0, 9, 8, 1)
    assert render(ctx, record((Status.WRITING, 1, 0, 9, 8, 1))) is None
    assert render(ctx, record((Status.WRITING, 1, 0, 9, 8, 1)), ANY_STATUS)["type"] == "ST_NFS"


def test_among_replicas_the_fastest_available_serving_one(context):
    replicas = record((Status.SERVING, 1, 0, 9, 8, 1), (Status.SERVING, 2, 0, 10, 10, 0))
    assert render(context(), replicas)["type"] == "ST_3FS"  # read weight 3 beats NFS's 5
    assert render(context(three_fs_available=False), replicas)["type"] == "ST_NFS"
    writing_fast = record((Status.SERVING, 1, 0, 9, 8, 1), (Status.WRITING, 2, 0, 10, 10, 0))
    assert render(context(), writing_fast)["type"] == "ST_NFS"
    assert render(context(), record((Status.SERVING, 3, 0, 9, 8, 1))) is None  # storage gone
    assert render(context(three_fs_available=False), record((Status.SERVING, 2, 0, 9, 8, 1))) is None


def test_spec_groups_and_spec_filters(context):
    ctx = context()
    loc = render(ctx, record((Status.SERVING, 2, 1, 9, 8, 3)))
    assert [s["name"] for s in loc["location_specs"]] == ["tp1"] and loc["spec_size"] == 1
    assert [s["uri"] for s in loc["location_specs"]] == uris(ctx, "3fs_01", 1, 9, 8, 3)
    filtered = render(ctx, record((Status.SERVING, 1, 0, 9, 8, 1)), spec_names=frozenset({"tp1"}))
    assert [s["name"] for s in filtered["location_specs"]] == ["tp1"]
    assert filtered["location_specs"][0]["uri"] == uris(ctx, "nfs_01", 0, 9, 8, 1)[1]


def test_padding_names_every_filtered_spec_with_an_empty_uri(context):
    padding = json.loads(LocationRenderer(context(), NAMES.get, frozenset({"tp0"})).padding())
    assert padding == {"type": "ST_UNSPECIFIED", "spec_size": 1, "location_specs": [{"name": "tp0", "uri": ""}]}


def _routed(*routes) -> InstanceGroup:
    strategies = [{"source_storage_name": s, "target_storage_name": t} for s, t in routes]
    return InstanceGroup.model_validate({"name": "g", "cache_config": {"migration_config": {"strategies": strategies}}})


def test_the_tier_of_a_storage_is_its_depth_in_the_groups_routes():
    # listed out of order: the chain mem -> nfs -> s3 still ranks by depth
    assert tier_depths(_routed(("nfs", "s3"), ("mem", "nfs"))) == {"nfs": 1, "s3": 2}
    assert tier_depths(_routed(("mem", "s3"), ("nfs", "s3"))) == {"s3": 1}  # two hot tiers over one cold
    assert tier_depths(InstanceGroup(name="g")) == {}
    # a promote route back leaves the order the first route set
    assert tier_depths(_routed(("a", "b"), ("b", "c"), ("c", "a"), ("b", "a"))) == {"b": 1, "c": 2}


def test_among_replicas_the_hotter_tier_wins_over_a_lower_read_weight(context):
    # the route makes nfs_01 (weight 5) the hot tier over 3fs_01 (weight 3)
    base = context()
    ctx = InstanceContext("i1", _routed(("nfs_01", "3fs_01")), 4, base.spec_layout, base.layout, base.storages)
    replicas = record((Status.SERVING, 2, 0, 10, 10, 0), (Status.SERVING, 1, 0, 9, 8, 1))
    assert render(ctx, replicas)["type"] == "ST_NFS"
    assert render(base, replicas)["type"] == "ST_3FS"  # no route: one tier, the lower read weight
    unavailable = context(three_fs_available=False)
    assert render(unavailable, record((Status.SERVING, 2, 0, 10, 10, 0))) is None
