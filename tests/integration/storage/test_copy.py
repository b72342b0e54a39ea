"""The byte copy between tiers (issue 24 item 2): ``read`` and ``write`` of the storage port,
run against every backend (conftest.BACKEND_KINDS), and ``copy_blocks`` for every pair of
backends the local stack runs for real. The bytes are checked at the URIs, read as an engine
reads them."""

import os

import pytest

from chalicelib.protocol.errors import UnsupportedError
from chalicelib.storage import SpecSlot, StorageCopyUnsupportedError, StorageError, copy_blocks

from .harness import SPECS

#: Backends whose bytes KVCM cannot reach: the pool's live in the pool service, Mooncake's in
#: its cluster (tests use an in-memory store for its metadata calls only).
NO_BYTES = {"mempool", "mooncake"}
FILE_KINDS = ["nfs-packed", "nfs-unpacked", "3fs"]
#: (source, target): every pair of file-like and S3 storages the local stack runs.
PAIRS = [
    ("nfs-packed", "nfs-unpacked"),
    ("nfs-unpacked", "nfs-packed"),
    ("nfs-packed", "3fs"),
    ("3fs", "nfs-unpacked"),
    ("nfs-packed", "s3"),
    ("nfs-unpacked", "s3"),
    ("3fs", "s3"),
    ("s3", "nfs-packed"),
    ("s3", "nfs-unpacked"),
    ("s3", "3fs"),
    ("s3", "s3"),
]


def payloads(blocks):
    return [[os.urandom(spec.size) for spec in block.specs] for block in blocks]


def test_write_puts_the_bytes_where_the_uris_point_and_read_returns_them(harness):
    blocks = harness.place("inst-1", [1, 2, 3, 4, 5])
    data = payloads(blocks)
    if harness.backend.sdk_type in ("pace", "mooncake"):
        with pytest.raises(StorageCopyUnsupportedError, match=harness.backend.name) as caught:
            harness.backend.write(blocks, data)
        assert isinstance(caught.value, UnsupportedError)  # wire UNSUPPORTED
        with pytest.raises(StorageCopyUnsupportedError):
            harness.backend.read(blocks)
        return
    harness.backend.write(blocks, data)
    assert [harness.read_block(b) for b in blocks] == data
    assert harness.backend.read(blocks) == data
    assert all(harness.backend.exists(b) for b in blocks)


def test_read_returns_what_an_engine_wrote(harness):
    if harness.backend.sdk_type in ("pace", "mooncake"):
        pytest.skip("KVCM cannot read this backend's bytes (the test above checks the refusal)")
    blocks = harness.place("../../escape", [7, 8, 9])
    for block in blocks:
        harness.write(block)
    assert harness.backend.read(blocks) == [harness.read_block(b) for b in blocks]


def test_reading_a_block_never_written_is_a_storage_error(harness):
    if harness.backend.sdk_type in ("pace", "mooncake"):
        pytest.skip("KVCM cannot read this backend's bytes")
    (written, missing) = harness.place("inst-1", [10, 11])
    harness.write(written)
    with pytest.raises(StorageError, match=harness.backend.name):
        harness.backend.read([written, missing])


def test_a_payload_of_the_wrong_size_writes_nothing(harness):
    if harness.backend.sdk_type in ("pace", "mooncake"):
        pytest.skip("KVCM cannot write this backend's bytes")
    (first, second) = harness.place("inst-1", [20, 21])
    data = payloads([first, second])
    data[1][1] = data[1][1][:-1]
    with pytest.raises(StorageError, match="payloads of"):
        harness.backend.write([first, second], data)
    assert not harness.backend.exists(first) and not harness.backend.exists(second)


@pytest.mark.parametrize(("source_kind", "target_kind"), PAIRS)
def test_copy_makes_the_target_bytes_equal_the_source_bytes(make_harness, source_kind, target_kind):
    source, target = make_harness(source_kind), make_harness(target_kind, copy=1)
    keys = list(range(100, 137))  # more than a batch, and packed files left part-full
    sources = source.place("inst-1", keys)
    for block in sources:
        source.write(block)
    targets = target.place("inst-1", keys)
    copied = copy_blocks(source.backend, sources, target.backend, targets, concurrency=3, batch_blocks=8)
    assert copied == len(keys) * sum(s.size for s in SPECS)
    assert [target.read_block(b) for b in targets] == [source.read_block(b) for b in sources]
    assert all(target.backend.exists(b) for b in targets)
    assert all(source.backend.exists(b) for b in sources), "a copy leaves the source alone"


@pytest.mark.parametrize("target_kind", ["nfs-packed", "s3"])
def test_copy_takes_the_specs_the_target_lists(make_harness, target_kind):
    source, target = make_harness("nfs-unpacked"), make_harness(target_kind, copy=1)
    sources = source.place("inst-1", [1, 2])
    for block in sources:
        source.write(block)
    only_tp1 = (SpecSlot("tp1", 0, SPECS[1].size),)
    targets = target.place("inst-1", [1, 2], specs=only_tp1)
    assert copy_blocks(source.backend, sources, target.backend, targets) == 2 * SPECS[1].size
    assert [target.read_block(b) for b in targets] == [source.read_block(b)[1:] for b in sources]


@pytest.mark.parametrize(
    ("specs", "problem"),
    [
        ((SpecSlot("tp0", 0, 64), SpecSlot("tp7", 64, 32)), "lacks spec 'tp7'"),
        ((SpecSlot("tp0", 0, 64), SpecSlot("tp1", 64, 16)), "holds 32 bytes of spec 'tp1'"),
    ],
)
def test_a_target_spec_the_source_cannot_fill_fails_before_any_byte_moves(make_harness, specs, problem):
    source, target = make_harness("nfs-packed"), make_harness("nfs-unpacked", copy=1)
    sources = source.place("inst-1", [1, 2])
    for block in sources:
        source.write(block)
    targets = target.place("inst-1", [1, 2], specs=specs)
    with pytest.raises(StorageError, match=problem):
        copy_blocks(source.backend, sources, target.backend, targets)
    assert not any(target.backend.exists(b) for b in targets)


@pytest.mark.parametrize("target_kind", ["nfs-packed", "s3"])
def test_a_copy_from_the_memory_pool_is_refused_and_writes_nothing(make_harness, target_kind):
    pool, target = make_harness("mempool"), make_harness(target_kind, copy=1)
    sources = pool.place("inst-1", [1, 2])
    targets = target.place("inst-1", [1, 2])
    with pytest.raises(StorageCopyUnsupportedError, match="pool_01: pace blocks cannot be read"):
        copy_blocks(pool.backend, sources, target.backend, targets)
    assert not any(target.backend.exists(b) for b in targets)


def test_a_failed_source_read_stops_the_copy_with_a_storage_error(make_harness):
    source, target = make_harness("s3"), make_harness("nfs-unpacked", copy=1)
    sources = source.place("inst-1", [1, 2, 3])
    source.write(sources[0])  # blocks 2 and 3 were never written
    targets = target.place("inst-1", [1, 2, 3])
    with pytest.raises(StorageError, match="s3_01: get s3://kvcm-data-01/kv/inst-1/tp0/"):
        copy_blocks(source.backend, sources, target.backend, targets, batch_blocks=1)
    assert target.backend.exists(targets[0]) and not target.backend.exists(targets[2])


def test_a_file_target_behind_a_link_is_not_written(make_harness, tmp_path):
    source, target = make_harness("nfs-unpacked"), make_harness("nfs-unpacked", copy=1)
    (block,) = source.place("inst-1", [1])
    source.write(block)
    (placed,) = target.place("inst-1", [1])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, os.path.join(target.backend.data_root, "inst-1"))
    with pytest.raises(StorageError, match="nfs_02: cannot write"):
        copy_blocks(source.backend, [block], target.backend, [placed])
    assert os.listdir(elsewhere) == []
