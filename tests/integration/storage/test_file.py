"""File backends on a real directory: layout, confinement, 3FS touch files, failures."""

import os
import threading

import pytest

from chalicelib.storage import (
    BlockRef,
    FileBackend,
    SpecSlot,
    StorageError,
    StorageUnavailableError,
    ThreeFSBackend,
)

from .harness import storage_config

SPECS = (SpecSlot("tp0", 0, 16), SpecSlot("tp1", 16, 16))


def nfs(root, pack=0, name="nfs_01"):
    return FileBackend(storage_config(name, "nfs", {"root_path": str(root), "key_count_per_file": pack}))


def threefs(mount, touch=True, pack=2, root_dir="kv/data/"):
    return ThreeFSBackend(
        storage_config(
            "3fs_01",
            "threefs",
            {
                "mountpoint": str(mount),
                "root_dir": root_dir,
                "key_count_per_file": pack,
                "touch_file_when_create": touch,
            },
        )
    )


def ref(instance="inst", key=1, location=10, group=10, slot=0, specs=SPECS):
    return BlockRef(instance, key, location, group, slot, specs)


def all_files(top):
    return sorted(os.path.relpath(os.path.join(d, f), top) for d, _, files in os.walk(top) for f in files)


def test_nfs_uri_and_path(tmp_path):
    backend = nfs(f"{tmp_path}/", pack=4)
    block = ref(group=0x1234, slot=3)
    assert backend.path("inst", "tp1", 0x1234) == f"{tmp_path}/inst/tp1/0000000000001234"
    assert backend.uri(block, SPECS[1]) == f"file://nfs_01{tmp_path}/inst/tp1/0000000000001234?blkid=3&size=16"


@pytest.mark.parametrize("pack", [0, 1])
def test_a_file_per_block_has_no_blkid(tmp_path, pack):
    backend = nfs(tmp_path, pack=pack)
    assert backend.uri(ref(group=0x1234), SPECS[0]) == f"file://nfs_01{tmp_path}/inst/tp0/0000000000001234?size=16"


def test_3fs_uri_path_is_absolute_on_the_mount(tmp_path):
    backend = threefs(tmp_path, root_dir="/a/b/")
    assert backend.data_root == f"{tmp_path}/a/b"
    assert (
        backend.uri(ref(group=255, slot=1), SPECS[0])
        == f"hf3fs://3fs_01{tmp_path}/a/b/inst/tp0/00000000000000ff?blkid=1&size=16"
    )


@pytest.mark.parametrize(
    "instance, spec", [("../../etc", "tp0"), ("..", ".."), ("a/../../..", "/x"), ("/abs", "nul\0")]
)
def test_hostile_names_stay_inside_the_data_root(tmp_path, instance, spec):
    root = tmp_path / "root"
    root.mkdir()
    backend = threefs(tmp_path / "mnt")
    (tmp_path / "mnt" / "kv" / "data").mkdir(parents=True)
    for target in (nfs(root), backend):
        path = target.path(instance, spec, 7)
        assert os.path.realpath(path).startswith(os.path.realpath(target.data_root) + os.sep)
    specs = (SpecSlot(spec, 0, 16),)
    backend.prepare([ref(instance=instance, specs=specs)])
    assert all_files(tmp_path / "mnt" / "kv" / "data") and not all_files(root)
    assert set(os.listdir(tmp_path)) == {"root", "mnt"}, "nothing was created beside the data roots"


def test_prepare_creates_empty_files_only_when_asked(tmp_path):
    (tmp_path / "kv" / "data").mkdir(parents=True)
    blocks = [ref(key=k, location=10 + k, group=10, slot=k) for k in range(2)]
    threefs(tmp_path, touch=False).prepare(blocks)
    assert all_files(tmp_path) == []
    backend = threefs(tmp_path, touch=True)
    backend.prepare(blocks)
    assert all_files(tmp_path) == ["kv/data/inst/tp0/000000000000000a", "kv/data/inst/tp1/000000000000000a"]
    assert all(os.path.getsize(backend.path("inst", s.name, 10)) == 0 for s in SPECS)
    assert not backend.exists(blocks[0]), "an empty touched file holds no block"


def test_prepare_never_creates_a_missing_data_root(tmp_path):
    with pytest.raises(StorageError, match="cannot create"):
        threefs(tmp_path).prepare([ref()])
    assert os.listdir(tmp_path) == []


def test_prepare_never_truncates_written_data(tmp_path):
    (tmp_path / "kv" / "data").mkdir(parents=True)
    backend = threefs(tmp_path)
    block = ref()
    backend.prepare([block])
    for spec in SPECS:
        with open(backend.path("inst", spec.name, 10), "wb") as handle:
            handle.write(b"x" * spec.size)
    backend.prepare([block])
    assert backend.exists(block)


def test_packed_exists_needs_the_slot_written(tmp_path):
    backend = nfs(tmp_path, pack=4)
    for spec in SPECS:
        os.makedirs(os.path.dirname(backend.path("inst", spec.name, 10)), exist_ok=True)
        with open(backend.path("inst", spec.name, 10), "wb") as handle:
            handle.write(b"x" * (2 * spec.size))  # slots 0 and 1 written
    assert backend.exists(ref(slot=1))
    assert not backend.exists(ref(slot=2))


def test_packed_delete_leaves_files_to_delete_groups(tmp_path):
    backend = nfs(tmp_path, pack=4)
    block = ref(slot=1)
    for spec in SPECS:
        os.makedirs(os.path.dirname(backend.path("inst", spec.name, 10)), exist_ok=True)
        open(backend.path("inst", spec.name, 10), "wb").close()
    backend.delete([block])
    assert len(all_files(tmp_path)) == 2, "other blocks of the file may still be live"
    backend.delete_groups("inst", [10], SPECS)
    assert all_files(tmp_path) == []


def test_unpacked_delete_removes_the_block_files(tmp_path):
    backend = nfs(tmp_path, pack=0)
    assert backend.pack_count == 1
    for spec in SPECS:
        os.makedirs(os.path.dirname(backend.path("inst", spec.name, 10)), exist_ok=True)
        open(backend.path("inst", spec.name, 10), "wb").close()
    backend.delete([ref()])
    assert all_files(tmp_path) == []


def test_delete_tries_every_file_then_reports(tmp_path):
    backend = nfs(tmp_path, pack=0)
    os.makedirs(backend.path("inst", "tp0", 10))  # a directory where a file should be: unlink fails
    os.makedirs(os.path.dirname(backend.path("inst", "tp1", 10)))
    open(backend.path("inst", "tp1", 10), "wb").close()
    with pytest.raises(StorageError, match="could not delete 1 file"):
        backend.delete_groups("inst", [10], SPECS)
    assert not os.path.exists(backend.path("inst", "tp1", 10))


def test_exists_reports_unreadable_metadata(tmp_path, monkeypatch):
    backend = nfs(tmp_path)
    os.makedirs(tmp_path / "inst" / "tp0")
    real_stat = os.stat

    def denied(path, *args, **kwargs):  # tests run as root: no permission bit can refuse a stat
        if path == backend.path("inst", "tp0", 10).rsplit(os.sep, 1)[1]:
            raise PermissionError(13, "Permission denied")
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", denied)
    with pytest.raises(StorageError, match="cannot stat"):
        backend.exists(ref())


@pytest.fixture
def outside(tmp_path):
    """A directory outside the data root holding a file named like a block file."""
    victim = tmp_path / "outside"
    victim.mkdir()
    return victim


@pytest.mark.parametrize("level", ["instance", "spec"])
def test_deletion_never_follows_a_linked_directory(tmp_path, outside, level):
    root = tmp_path / "root"
    backend = nfs(root, pack=0)
    block_file = backend.path("inst", "tp0", 10)
    name = os.path.basename(block_file)
    (outside / name).write_bytes(b"precious")
    if level == "instance":
        root.mkdir()
        (outside / "tp0").mkdir()
        os.rename(outside / name, outside / "tp0" / name)
        os.symlink(outside, root / "inst")
        target = outside / "tp0" / name
    else:
        (root / "inst").mkdir(parents=True)
        os.symlink(outside, root / "inst" / "tp0")
        target = outside / name
    backend.delete_groups("inst", [10], SPECS)
    backend.delete([ref()])
    assert target.read_bytes() == b"precious"
    assert not backend.exists(ref(specs=SPECS[:1]))


def test_a_linked_block_file_is_unlinked_itself_and_never_vouched_for(tmp_path, outside):
    backend = nfs(tmp_path / "root", pack=0)
    block_file = backend.path("inst", "tp0", 10)
    os.makedirs(os.path.dirname(block_file))
    (outside / "big").write_bytes(b"x" * 64)
    os.symlink(outside / "big", block_file)
    assert not backend.exists(ref(specs=SPECS[:1]))
    backend.delete([ref(specs=SPECS[:1])])
    assert not os.path.lexists(block_file) and (outside / "big").read_bytes() == b"x" * 64


def test_the_probe_never_writes_through_a_link(tmp_path, outside, monkeypatch):
    import uuid as uuid_module

    backend = nfs(tmp_path / "root")
    (tmp_path / "root").mkdir()
    fixed = uuid_module.UUID(int=7)
    monkeypatch.setattr(uuid_module, "uuid4", lambda: fixed)
    os.symlink(outside / "target", tmp_path / "root" / f".kvcm-probe-{fixed.hex}")
    with pytest.raises(StorageUnavailableError):
        backend.probe()
    assert not (outside / "target").exists()


def test_probe_leaves_nothing_behind_and_runs_concurrently(tmp_path):
    backend = nfs(tmp_path)
    errors = []

    def probe():
        try:
            backend.probe()
        except StorageUnavailableError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=probe) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and os.listdir(tmp_path) == []


@pytest.mark.parametrize("breakage", ["missing", "a file"])
def test_probe_fails_clearly(tmp_path, breakage):
    root = tmp_path / "root"
    if breakage == "a file":
        root.write_text("not a directory")
    with pytest.raises(StorageUnavailableError, match=f"nfs_01: cannot write in {root}"):
        nfs(root).probe()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through directory permissions")
def test_probe_fails_on_a_read_only_root(tmp_path):
    root = tmp_path / "ro"
    root.mkdir()
    root.chmod(0o500)
    try:
        with pytest.raises(StorageUnavailableError, match="Permission denied"):
            nfs(root).probe()
    finally:
        root.chmod(0o700)
