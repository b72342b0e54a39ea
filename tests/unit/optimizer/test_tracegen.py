"""Generated prefix-cache traces: seeded, exactly the distinct blocks asked, prefix-chained
block ids, and the shapes they promise."""

from __future__ import annotations

import pytest

from chalicelib.optimizer.errors import ConfigError
from chalicelib.optimizer.tracegen import TraceShape, generate_records, write_mooncake
from chalicelib.optimizer.traces import Op, read_trace


@pytest.mark.parametrize("settings", [{}, {"system_prompts": 0, "reuse_skew": 1.2}, {"fork": 0.5, "live": 50}])
def test_traces_are_seeded_sized_and_prefix_chained(settings):
    shape = TraceShape(distinct_blocks=20_000, seed=7, **settings)
    records = list(generate_records(shape))
    assert records == list(generate_records(shape))
    assert records != list(generate_records(TraceShape(distinct_blocks=20_000, seed=8, **settings)))
    assert {k for r in records for k in r.keys} == set(range(20_000))
    parent: dict[int, int | None] = {}
    for record in records:
        assert record.op is Op.REQUEST and len(set(record.keys)) == len(record.keys)
        for i, key in enumerate(record.keys):  # a block id fixes its whole prefix
            assert parent.setdefault(key, record.keys[i - 1] if i else None) == (record.keys[i - 1] if i else None)


def test_shared_system_prompts_start_the_conversations_with_zipf_popularity():
    shape = TraceShape(distinct_blocks=50_000, system_prompts=3, system_blocks=10, system_skew=1.0)
    firsts = [r.keys[0] for r in generate_records(shape)]
    counts = [firsts.count(10 * s) for s in range(3)]  # the prompts are blocks 0..29
    assert sum(counts) == len(firsts) and counts[0] > counts[1] > counts[2]


def test_mooncake_output_reads_back_as_the_same_requests(tmp_path):
    shape = TraceShape(distinct_blocks=3000, seed=1)
    path = tmp_path / "t.jsonl"
    assert write_mooncake(shape, path) == len(records := list(generate_records(shape)))
    assert [r.keys for r in read_trace(path, "mooncake")] == [list(r.keys) for r in records]


def test_bad_shapes_are_config_errors():
    for bad in (
        {"distinct_blocks": 0},
        {"distinct_blocks": 200, "followup": 1.0},
        {"distinct_blocks": 200, "live": 0},
        {"distinct_blocks": 128},
    ):
        with pytest.raises(ConfigError):
            TraceShape(**bad)
