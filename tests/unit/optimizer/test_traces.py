"""Trace readers: the shared real samples, synthetic samples of every format, bad input."""

from __future__ import annotations

import json

import pytest

from chalicelib.optimizer.errors import ConfigError, TraceFormatError
from chalicelib.optimizer.traces import FORMATS, Op, Query, Record, block_keys_from_tokens, read_trace, sniff_format


def write_lines(path, lines):
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def test_event_log_success_masks_and_tokens(tmp_path):
    keys = [11, 12, 13, 14]
    path = write_lines(
        tmp_path / "events.log",
        [
            {
                "type": "GetCacheLocation",
                "source": "i",
                "trigger_time_us": 10,
                "keys": keys,
                "block_mask": [True, True, False, False],
                "query_type": "batch_get",
                "sw_size": -1,
            },
            {"type": "StartWriteCache", "source": "i", "trigger_time_us": 20, "keys": keys, "write_session_id": "s1"},
            {
                "type": "StartWriteCache",
                "source": "i",
                "trigger_time_us": 25,
                "keys": [],
                "tokens": list(range(1, 9)),
                "write_session_id": "s2",
            },
            {
                "type": "FinishWriteCache",
                "source": "i",
                "trigger_time_us": 30,
                "write_session_id": "s1",
                "success_block": {"bool_masks": {"values": [True, False, True, True]}},
            },
            {"type": "CacheReclaimSubmit", "source": "i", "trigger_time_us": 40, "block_keys": [1]},
            {
                "type": "FinishWriteCache",
                "source": "i",
                "trigger_time_us": 50,
                "write_session_id": "unknown",
                "success_block": 1,
            },
            {"type": "GetCacheLocation", "source": "i", "trigger_time_us": 200_000, "keys": keys},
        ],
    )
    records = list(read_trace(path, "kvcm_events", block_size=4))
    assert [(r.op, r.timestamp_us) for r in records] == [
        (Op.READ, 10),
        (Op.WRITE, 30),
        (Op.WRITE, 100_025),
        (Op.READ, 200_000),
    ]
    read = records[0]
    assert read.mask == 2 and read.query is Query.BATCH_GET and read.sw_size == 0
    # a bool success mask with a hole keeps the chain: the failed key is masked out
    assert list(records[1].keys) == keys and records[1].mask == (False, True, False, False)
    assert list(records[2].keys) == [455111481605203084, 6902853672176602142]


def test_rolling_hash_test_vector():
    assert block_keys_from_tokens(list(range(1, 9)), 4) == [455111481605203084, 6902853672176602142]
    assert block_keys_from_tokens(list(range(1, 8)), 4) == [455111481605203084]  # partial block dropped


def test_qwen_bailian(tmp_path):
    path = write_lines(
        tmp_path / "bailian.jsonl",
        [
            {
                "chat_id": 1,
                "parent_chat_id": -1,
                "timestamp": 1.5,
                "input_length": 40,
                "output_length": 9,
                "type": "text",
                "turn": 1,
                "hash_ids": [5, 6, 7],
            },
            {
                "chat_id": 2,
                "parent_chat_id": 1,
                "timestamp": 2.25,
                "input_length": 70,
                "output_length": 3,
                "type": "text",
                "turn": 2,
                "hash_ids": [5, 6, 7, 8, 9],
            },
        ],
    )
    assert sniff_format(path) == "qwen_bailian"
    records = list(read_trace(path, instance="qwen"))
    assert records == [
        Record("qwen", 1_500_000, Op.REQUEST, [5, 6, 7], 0, 40),
        Record("qwen", 2_250_000, Op.REQUEST, [5, 6, 7, 8, 9], 0, 70),
    ]
    assert FORMATS["qwen_bailian"].block_size == 16


def test_upstream_schema(tmp_path):
    big = 2**64 - 1  # unsigned keys map onto int64 by two's complement
    path = write_lines(
        tmp_path / "upstream.jsonl",
        [
            {
                "instance_id": "x",
                "timestamp_us": 5,
                "keys": [1, 2, big],
                "query_type": "prefix_match",
                "block_mask": 1,
                "input_len": 40,
            },
            {"instance_id": "x", "timestamp_us": 6, "keys": [1, 2, 3]},
            {"type": "request", "instance_id": "y", "timestamp_ns": 7_000, "keys": [4], "input_len": 3},
            {
                "instance_id": "x",
                "timestamp_us": 8,
                "keys": [1],
                "input_len": 20,
                "output_len": 5,
                "total_keys": [1, 2],
            },
            {
                "type": "get",
                "instance_id": "x",
                "timestamp_us": 9,
                "tokens": list(range(1, 9)),
                "query_type": "QT_REVERSE_ROLL_SW_MATCH",
                "sw_size": 2,
            },
        ],
    )
    assert sniff_format(path) == "upstream"
    records = list(read_trace(path, block_size=4))
    assert records[0] == Record("x", 5, Op.READ, [1, 2, -1], 1, 40)
    assert records[1] == Record("x", 6, Op.WRITE, [1, 2, 3])
    assert records[2] == Record("y", 7, Op.REQUEST, [4], 0, 3)
    assert (records[3].op, records[4].op, list(records[4].keys)) == (Op.READ, Op.WRITE, [1, 2])
    assert records[5].query is Query.REVERSE_ROLL_SW_MATCH and records[5].sw_size == 2
    assert records[5].input_tokens == 8 and len(records[5].keys) == 2


@pytest.mark.parametrize(
    "fmt, lines, line, message",
    [
        ("mooncake", ['{"timestamp": 0, "hash_ids": [1]}', '{"timestamp": 1, "hash_ids": [1,'], 2, "invalid JSON"),
        ("mooncake", ['{"timestamp": 0, "hash_ids": [1]}', "", '{"timestamp": 1}'], 3, "hash_ids"),
        ("mooncake", ['{"timestamp": 0, "hash_ids": [1, "2"]}'], 1, "list of integers"),
        ("mooncake", ["[1, 2]"], 1, "JSON object"),
        (
            "qwen_bailian",
            ['{"chat_id": 1, "parent_chat_id": -1, "timestamp": "x", "turn": 1, "type": "text", "hash_ids": [1]}'],
            1,
            "timestamp",
        ),
        ("kvcm_events", ['{"type": "GetCacheLocation", "source": "i", "keys": [1]}'], 1, "trigger_time_us"),
        (
            "kvcm_events",
            ['{"type": "GetCacheLocation", "source": "i", "trigger_time_us": 1, "keys": [1], "block_mask": "all"}'],
            1,
            "block mask",
        ),
        (
            "kvcm_events",
            [
                '{"type": "StartWriteCache", "source": "i", "trigger_time_us": 1, '
                '"keys": [1, 2], "write_session_id": "s"}',
                '{"type": "FinishWriteCache", "source": "i", "trigger_time_us": 2, '
                '"write_session_id": "s", "success_block": [true]}',
            ],
            2,
            "success_block",
        ),
        (
            "kvcm_events",
            ['{"type": "GetCacheLocation", "source": "i", "trigger_time_us": 1, "keys": [], "tokens": [1, 2]}'],
            1,
            "block size",
        ),
        ("upstream", ['{"type": "delete", "instance_id": "x", "timestamp_us": 1, "keys": []}'], 1, "unknown type"),
        ("upstream", ['{"instance_id": "x", "timestamp_us": 1, "keys": [1], "query_type": "scan"}'], 1, "query_type"),
    ],
)
def test_malformed_lines_name_the_line(tmp_path, fmt, lines, line, message):
    path = write_lines(tmp_path / "bad.jsonl", lines)
    with pytest.raises(TraceFormatError) as info:
        list(FORMATS[fmt].reader(path, block_size=None))
    assert info.value.line == line
    assert message in str(info.value)
    assert f"bad.jsonl:{line}:" in str(info.value)


def test_unknown_format_and_unsniffable_trace(tmp_path):
    path = write_lines(tmp_path / "x.jsonl", [{"hello": 1}])
    with pytest.raises(TraceFormatError) as info:
        sniff_format(path)
    assert info.value.line == 1
    with pytest.raises(ConfigError):
        read_trace(path, "csv")
    with pytest.raises(TraceFormatError):
        sniff_format(write_lines(tmp_path / "empty.jsonl", []))


def test_readers_stream(tmp_path):
    """A reader yields records before it reaches a bad line further down."""
    path = write_lines(tmp_path / "t.jsonl", ['{"timestamp": 0, "hash_ids": [1]}', "not json"])
    stream = read_trace(path, "mooncake")
    assert next(stream).keys == [1]
    with pytest.raises(TraceFormatError):
        next(stream)
