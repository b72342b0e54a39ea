"""The read script (lua/read.lua) with the buckets named by the client: records found
whatever the key's sign or bucket sharing, recency refreshed only for what is served."""

import random

from chalicelib.index.types import MODE_BATCH, MODE_PREFIX, MODE_RAW, MODE_WINDOW

from .test_block_index import finish, start


def written(index, layout, keys, sid="s1"):
    start(index, layout, keys, sid=sid)
    finish(index, layout, sid, [True] * len(keys))


def access_times(index, layout, keys):
    return [r.last_access_s for r in index.read(layout, keys, MODE_RAW)]


def test_many_keys_sharing_buckets_and_negative_keys_read_back_in_order(index, layout):
    # 16 buckets (layout bits 4): 1,024 keys share them; negative keys pick their bucket by
    # the two's complement low bits, in the client's names as in the scripts' (start.lua).
    keys = [k * 7919 - 4_000_000 for k in range(1024)]
    assert any(k < 0 for k in keys) and any(k > 0 for k in keys)
    for i in range(0, len(keys), 256):
        written(index, layout, keys[i : i + 256], sid=f"s{i}")
    recs = index.read(layout, keys, MODE_PREFIX)
    assert len(recs) == 1024
    assert [r.parent for r in recs[1:256]] == keys[:255]
    assert index.read(layout, [keys[5], 12345, keys[-1]], MODE_BATCH)[1] is None


def test_a_read_refreshes_the_recency_of_served_keys_once_per_touch_interval(index, layout, clock):
    written(index, layout, [1, 2, 3])
    written_at = access_times(index, layout, [1, 2, 3])
    clock.advance(index.TOUCH_INTERVAL_S + 5)
    index.read(layout, [1, 2, 99, 3], MODE_PREFIX)  # the prefix stops at 99: 3 is not served
    touched = int(clock.now())
    assert access_times(index, layout, [1, 2, 3]) == [touched, touched, written_at[2]]
    clock.advance(index.TOUCH_INTERVAL_S / 2)
    index.read(layout, [1, 2, 3], MODE_BATCH)  # within the interval for 1 and 2
    assert access_times(index, layout, [1, 2, 3]) == [touched, touched, int(clock.now())]


def test_window_refreshes_only_the_window_and_raw_reads_refresh_nothing(index, layout, clock):
    written(index, layout, [1, 2, 3, 4])
    before = access_times(index, layout, [1, 2, 3, 4])
    clock.advance(index.TOUCH_INTERVAL_S + 5)
    index.read(layout, [1, 2, 3, 4], MODE_RAW)
    assert access_times(index, layout, [1, 2, 3, 4]) == before
    recs = index.read(layout, [1, 2, 3, 4], MODE_WINDOW, 2)
    assert [r is not None for r in recs] == [False, False, True, True]
    now = int(clock.now())
    assert access_times(index, layout, [1, 2, 3, 4]) == before[:2] + [now, now]


def expected_read(keys, served, stored, covered, mode, sw):
    """What each read mode answers, written out from API.md's rules: per position, whether
    a record comes back (None: not answered past a prefix's end)."""
    ok = [served[k] or c for k, c in zip(keys, covered, strict=True)]
    if mode == MODE_RAW:
        return [stored[k] for k in keys]
    if mode == MODE_BATCH:
        return [served[k] for k in keys]
    if mode == MODE_PREFIX:
        end = ok.index(False) if False in ok else len(keys)
        return [served[k] for k in keys[:end]]
    starts = [s for s in range(len(keys) - sw, -1, -1) if all(ok[s : s + sw])]
    window = range(starts[0], starts[0] + sw) if starts else range(0)
    return [served[k] and i in window for i, k in enumerate(keys)]


def test_every_mode_answers_and_refreshes_as_its_rules_say(index, layout, clock):
    # Served, being written (not served) and unknown keys, interleaved, with keys covered
    # elsewhere: each mode's answer and the keys it refreshes, against the rules above.
    rng = random.Random(25)
    keys = rng.sample(range(1, 1 << 40), 48)
    writing = set(keys[5::7])
    unknown = set(keys[9::11]) - writing
    written(index, layout, [k for k in keys if k not in writing and k not in unknown])
    start(index, layout, sorted(writing), sid="open")
    served = {k: k not in writing and k not in unknown for k in keys}
    stored = {k: k not in unknown for k in keys}
    for trial in range(24):
        query = rng.sample(keys, rng.randint(1, len(keys)))
        covered = [rng.random() < 0.2 for _ in query]
        mode = (MODE_PREFIX, MODE_BATCH, MODE_WINDOW, MODE_RAW)[trial % 4]
        sw = rng.randint(1, 4)
        clock.advance(index.TOUCH_INTERVAL_S + 1)
        before = dict(zip(keys, (r and r.last_access_s for r in index.read(layout, keys, MODE_RAW)), strict=True))
        got = index.read_raw(layout, query, mode, sw, None, covered)
        want = expected_read(query, served, stored, covered, mode, sw)
        assert [r is not None for r in got] == want, (mode, sw)
        refreshed = {k for k, hit in zip(query, want, strict=False) if hit and mode != MODE_RAW}
        after = dict(zip(keys, (r and r.last_access_s for r in index.read(layout, keys, MODE_RAW)), strict=True))
        now = int(clock.now())
        assert {k for k in keys if after[k] != before[k]} == {k for k in refreshed if before[k] != now}
        assert all(after[k] == now for k in refreshed)
