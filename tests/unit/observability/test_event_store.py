"""The partitioned event log: per-group, per-hour objects, flushed by size, age and on
demand, read back in time order (observability/event_store.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from chalicelib.observability.event_store import PartitionedEventWriter, is_partitioned, read_group_lines
from chalicelib.observability.events import EventLog
from chalicelib.storage.objects import DirectoryStore, open_store

HOUR_US = 3600 * 1_000_000
T0 = int(datetime(2026, 12, 1, 10, 59, tzinfo=UTC).timestamp() * 1e6)


class Ticks:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def line(source: str, time_us: int, n: int = 0) -> str:
    return json.dumps({"source": source, "type": "GetCacheLocation", "trigger_time_us": time_us, "keys": [n]})


def test_objects_per_group_and_hour_written_on_flush(tmp_path):
    writer = PartitionedEventWriter(DirectoryStore(str(tmp_path)), "log", container_id="c1")
    writer.append("g1", T0, line("i1", T0))
    writer.append("g1", T0 + 60_000_000, line("i1", T0 + 60_000_000))  # 11:00, the next hour
    writer.append("g/2", T0, line("i2", T0))
    assert writer.pending() == 3 and not list(tmp_path.rglob("*.jsonl"))
    assert writer.flush() == 3 and writer.pending() == 0
    keys = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.jsonl"))
    assert keys == [
        "log/events/g%2F2/2026-12-01/10/c1-000003.jsonl",
        "log/events/g1/2026-12-01/10/c1-000001.jsonl",
        "log/events/g1/2026-12-01/11/c1-000002.jsonl",
    ]
    assert writer.flush() == 0  # nothing left: no empty objects


def test_flushed_by_size_and_by_age_as_lines_arrive(tmp_path):
    ticks = Ticks()
    writer = PartitionedEventWriter(DirectoryStore(str(tmp_path)), flush_bytes=300, flush_age_s=60, monotonic=ticks)
    writer.append("g1", T0, line("i1", T0))
    ticks.now = 59.0
    writer.append("g1", T0, line("i1", T0))
    assert writer.pending() == 2
    ticks.now = 60.0
    writer.append("g1", T0, line("i1", T0))  # the oldest line is a minute old
    assert writer.pending() == 0 and len(list(tmp_path.rglob("*.jsonl"))) == 1
    for n in range(5):
        writer.append("g1", T0, line("i1", T0, n))
    assert writer.pending() == 1  # 300 bytes reached at the fourth line (96 bytes each)


class FailingStore(DirectoryStore):
    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.failing = True

    def put(self, key: str, body: bytes) -> None:
        if self.failing:
            raise OSError("bucket unreachable")
        super().put(key, body)


def test_a_failed_write_keeps_its_lines_within_the_bound(tmp_path):
    store = FailingStore(str(tmp_path))
    writer = PartitionedEventWriter(store, max_buffer_bytes=1000)
    for n in range(3):
        writer.append("g1", T0, line("i1", T0 + n, n))
    assert writer.flush() == 0 and writer.pending() == 3 and writer.dropped_lines == 0
    store.failing = False
    assert writer.flush() == 3
    lines = read_group_lines(store, "", "g1", T0, T0 + HOUR_US)
    assert [json.loads(t)["keys"] for t in lines] == [[0], [1], [2]]
    store.failing = True
    writer.append("g1", T0, "x" * 2000)
    assert writer.flush() == 0 and writer.pending() == 0 and writer.dropped_lines == 1


def test_read_back_merges_containers_in_time_order_within_the_window(tmp_path):
    store = DirectoryStore(str(tmp_path))
    first, second = PartitionedEventWriter(store, "p", "a"), PartitionedEventWriter(store, "p", "b")
    for n, writer in enumerate([first, second, first, second]):
        writer.append("g1", T0 + n, line("i1", T0 + n, n))
    second.append("g1", T0 + HOUR_US, line("i1", T0 + HOUR_US, 9))  # past the window
    first.append("g2", T0 + 1, line("i2", T0 + 1, 7))  # another group
    first.flush(), second.flush()
    lines = read_group_lines(store, "p", "g1", T0 + 1, T0 + HOUR_US)
    assert [json.loads(t)["keys"] for t in lines] == [[1], [2], [3]]
    assert read_group_lines(store, "p", "nobody", T0, T0 + HOUR_US) == []


def test_event_log_settings_and_groups(tmp_path):
    assert is_partitioned("s3://bucket/prefix") and is_partitioned("dir:/x") and is_partitioned("/x/")
    assert not is_partitioned("/x/events.log") and not is_partitioned("stdout")
    store, prefix = open_store("s3://bucket/a/b/", lambda: None)
    assert (store.bucket, prefix) == ("bucket", "a/b")
    with pytest.raises(ValueError):
        open_store("s3:///prefix", lambda: None)

    def group_of(instance_id: str) -> str:
        if instance_id == "gone":
            raise LookupError(instance_id)
        return {"i1": "g1"}[instance_id]

    log = EventLog.from_settings(
        f"dir:{tmp_path}", open_objects=lambda target: open_store(target, lambda: None), group_of=group_of
    )
    assert log.enabled
    log.publish("i1", "GetCacheLocation", T0, keys=[1])
    log.publish("gone", "GetCacheLocation", T0, keys=[2])
    assert log.flush() == 2
    (mine,) = read_group_lines(DirectoryStore(str(tmp_path)), "", "g1", T0, T0 + 1)
    assert json.loads(mine)["keys"] == [1] and json.loads(mine)["source"] == "i1"
    assert read_group_lines(DirectoryStore(str(tmp_path)), "", "_unknown", T0, T0 + 1)
    assert EventLog.from_settings(str(tmp_path / "events.log")).flush() == 0  # a file: nothing buffered
