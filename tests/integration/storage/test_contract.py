"""The StorageBackend contract, run against every backend (see conftest.BACKEND_KINDS)."""

import pytest

from chalicelib.storage import StorageUnavailableError

from .harness import SPECS, split_uri

HOSTILE_IDS = ["inst-1", "../../escape", "a/b_c", "ünïcode id", ".hidden"]


def test_uris_name_the_storage_and_size_each_spec(harness):
    blocks = harness.place("inst-1", [11, 12, 13, -14, 2**63 - 1])
    uris = set()
    for block in blocks:
        for spec in SPECS:
            uri = harness.backend.uri(block, spec)
            scheme, host, _, query = split_uri(uri)
            assert host == harness.backend.name
            assert int(query["size"]) == spec.size
            uris.add(uri)
    assert len(uris) == len(blocks) * len(SPECS), "every (block, spec) has its own URI"


def test_same_key_in_two_instances_has_separate_data(harness):
    (mine,) = harness.place("inst-a", [42])
    (theirs,) = harness.place("inst-b", [42])
    assert {harness.backend.uri(mine, s) for s in SPECS}.isdisjoint(harness.backend.uri(theirs, s) for s in SPECS)
    harness.write(mine)
    harness.write(theirs)
    harness.remove([mine])
    assert harness.backend.exists(theirs)
    assert not harness.backend.exists(mine)


@pytest.mark.parametrize("instance_id", HOSTILE_IDS)
def test_write_exists_delete_cycle(harness, instance_id):
    blocks = harness.place(instance_id, [1, 2])
    if harness.tracks_data:
        assert not any(harness.backend.exists(b) for b in blocks), "nothing written yet"
    for block in blocks:
        harness.write(block)
    assert all(harness.backend.exists(b) for b in blocks)
    harness.remove(blocks)
    assert not any(harness.backend.exists(b) for b in blocks)


def test_delete_is_idempotent(harness):
    blocks = harness.place("inst-1", [5, 6, 7])
    for block in blocks:
        harness.write(block)
    harness.remove(blocks)
    harness.remove(blocks)
    assert not any(harness.backend.exists(b) for b in blocks)


def test_deleting_never_written_blocks_is_fine(harness):
    blocks = harness.place("inst-1", [8, 9])
    harness.remove(blocks)
    assert not any(harness.backend.exists(b) for b in blocks)


def test_removing_one_group_keeps_the_others(harness):
    pack = max(harness.backend.pack_count, 1)
    blocks = harness.place("inst-1", list(range(100, 100 + 2 * pack)))
    for block in blocks:
        harness.write(block)
    first, second = blocks[:pack], blocks[pack:]
    if harness.backend.pack_count > 0:
        assert {b.group_id for b in first}.isdisjoint(b.group_id for b in second)
    harness.remove(first)
    assert not any(harness.backend.exists(b) for b in first)
    assert all(harness.backend.exists(b) for b in second)


def test_a_block_is_not_complete_until_every_spec_is_written(harness):
    if not harness.tracks_data:
        pytest.skip("the memory pool tracks allocations, not bytes")
    (block,) = harness.place("inst-1", [77])
    harness.write_uri(harness.backend.uri(block, SPECS[0]), SPECS[0].size)
    assert not harness.backend.exists(block)
    harness.write_uri(harness.backend.uri(block, SPECS[1]), SPECS[1].size)
    assert harness.backend.exists(block)


def test_probe_passes_on_a_healthy_storage(harness):
    harness.backend.probe()
    harness.backend.probe()  # repeatable: a probe leaves nothing behind that trips the next


def test_probe_fails_on_a_broken_storage(harness):
    with pytest.raises(StorageUnavailableError, match=harness.backend.name):
        harness.broken().probe()
