"""Trace readers: the shared real samples, synthetic samples of every format, bad input."""

from __future__ import annotations

import json

from chalicelib.optimizer.traces import Op, Query, Record, sniff_format
from tests.helpers import CONVERSATION, EVENT_LOG


def test_mooncake_conversation_matches_the_readme(conversation):
    assert len(conversation) == 12_031
    assert sum(len(r.keys) for r in conversation) == 288_500
    assert len({k for r in conversation for k in r.keys}) == 182_790
    first = conversation[0]
    assert first == Record("default", 0, Op.REQUEST, list(range(14)), 0, 6758)
    assert all(r.op is Op.REQUEST for r in conversation)
    # timestamps are milliseconds in the file, microseconds in records
    assert conversation[-1].timestamp_us == 3_536_999_000


def test_event_log_sample(event_log):
    reads = [r for r in event_log if r.op is Op.READ]
    writes = [r for r in event_log if r.op is Op.WRITE]
    assert len(reads) == 102
    # 96 finished sessions + 6 never finished (written 100 ms after their start)
    assert len(writes) == 102
    assert {r.instance for r in event_log} == {"3780643326877293460"}
    assert all(r.query is Query.PREFIX_MATCH and type(r.mask) is int for r in reads)
    stamps = [r.timestamp_us for r in event_log]
    assert stamps == sorted(stamps)
    # the first session: 13 started keys, success_block 12 -> the first 12 keys written
    first_write = writes[0]
    assert len(first_write.keys) == 12 and first_write.timestamp_us == 1763975745710698
    # the session started at line 8 never finishes: written at start + 100 ms, in order
    start = json.loads(EVENT_LOG.read_text().splitlines()[7])
    late = [w for w in writes if w.timestamp_us == start["trigger_time_us"] + 100_000]
    assert len(late) == 1 and list(late[0].keys) == start["keys"]


def test_sniffing_the_shared_samples():
    assert sniff_format(CONVERSATION) == "mooncake"
    assert sniff_format(EVENT_LOG) == "kvcm_events"
