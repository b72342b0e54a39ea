"""getHostCacheState's keys as the walk's arguments (reporters.key_runs): the first key
alone, then runs doubling from 256 to 4,096 keys (what the walk reads before it may stop),
each key a msgpack fixstr of its 8-byte field, in order."""

from __future__ import annotations

import msgpack

from chalicelib.stores.reporters import KEY_RUN_MAX, block_field, key_runs


def _all(run: bytes) -> list[bytes]:
    unpacker = msgpack.Unpacker(raw=True)
    unpacker.feed(run)
    return list(unpacker)


def test_runs_double_up_to_the_cap_and_keep_the_keys_in_order():
    keys = [(-1) ** k * (k << 40) + k for k in range(20_000)]
    runs = key_runs(keys)
    assert [len(run) // 9 for run in runs] == [1, 256, 512, 1024, 2048, 4096, 4096, 4096, 3871]
    assert [field for run in runs for field in _all(run)] == [block_field(k) for k in keys]
    assert max(len(run) // 9 for run in runs) == KEY_RUN_MAX


def test_a_short_prompt_is_its_first_key_and_one_run():
    assert key_runs([7]) == [b"\xa8" + block_field(7)]
    assert [len(run) // 9 for run in key_runs([1, 2, 3])] == [1, 2]
