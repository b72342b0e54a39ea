"""The read script (lua/read.lua) with the buckets named by the client: records found
whatever the key's sign or bucket sharing, recency refreshed only for what is served."""

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
