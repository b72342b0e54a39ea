"""The read without a script (index/reads.py) against a real Valkey: one MULTI ... EXEC
exchange, the recency refresh (lua/touch.lua) sent after the answer and read back later,
and what can happen between the two: scripts lost, buckets split, a connection dropped,
the record changed or gone, threads sharing the index."""

import threading
import time

import pytest
import redis

from chalicelib.index import BlockIndex, Status
from chalicelib.index.types import MODE_BATCH, MODE_PREFIX, MODE_RAW, bucket_index
from chalicelib.valkey import ValkeyUnavailableError
from tests.helpers import busy_valkey

from .test_block_index import SIZES, finish, start


def written(index, layout, keys, sid="s1"):
    start(index, layout, keys, sid=sid)
    finish(index, layout, sid, [True] * len(keys))


def access_times(index, layout, keys):
    return [r.last_access_s if r else None for r in index.read(layout, keys, MODE_RAW)]


def calls(valkey):
    stats = valkey.info("commandstats")
    return {name.removeprefix("cmdstat_"): value["calls"] for name, value in stats.items()}


def test_a_read_with_nothing_due_is_one_transaction_and_no_script(index, layout, valkey):
    written(index, layout, [1, 2, 3])
    index.read_raw(layout, [1], MODE_PREFIX)  # learns the bucket count (a first read may read twice)
    index.settle()
    valkey.config_resetstat()
    assert len(index.read_raw(layout, [1, 2, 3, 4], MODE_PREFIX)) == 3
    sent = calls(valkey)
    assert (sent.get("multi"), sent.get("exec"), sent.get("hget")) == (1, 1, 4)
    assert not {"evalsha", "eval", "hset"} & sent.keys()


def test_a_due_read_sends_the_refresh_after_its_answer_and_settle_reads_it_back(index, layout, valkey, clock):
    written(index, layout, [1, 2, 3])
    clock.advance(index.TOUCH_INTERVAL_S + 5)
    valkey.config_resetstat()
    records = index.read(layout, [1, 2, 3], MODE_BATCH)
    now = int(clock.now())
    assert [r.last_access_s for r in records] == [now] * 3  # answered as refreshed
    index.settle()
    sent = calls(valkey)
    assert sent.get("evalsha") == 1 and sent.get("hset") == 3
    assert access_times(index, layout, [1, 2, 3]) == [now] * 3


def test_a_refresh_changes_only_recency_and_never_brings_a_record_back(index, layout, valkey, clock):
    written(index, layout, [1, 2])
    # The refresh as a read sends it, after the record changed (1 marked DELETING) or went
    # (2 dropped) between the read and the refresh reaching Valkey.
    victims = index.mark_deleting(layout, [1, 2], SIZES)
    index.drop(layout, [v for v in victims if v.block_key == 2], SIZES)
    before = index.read(layout, [1], MODE_RAW)[0]
    clock.advance(index.TOUCH_INTERVAL_S + 5)
    now = int(clock.now())
    count = index.bucket_count(layout)
    buckets = [layout.bucket(bucket_index(k, count)) for k in (1, 2)]
    refreshed = index._touch(
        keys=[layout.key("m"), *buckets],
        args=[(1).to_bytes(8, "big") + (2).to_bytes(8, "big"), count, now, index.TOUCH_INTERVAL_S, bytes([9, 9])],
    )
    assert refreshed == 1
    one, two = index.read(layout, [1, 2], MODE_RAW)
    assert two is None
    assert [loc.status for loc in one.locations] == [Status.DELETING]
    assert (one.last_access_s, one.lfu) == (now, 9)
    assert one.locations == before.locations


def test_a_refresh_lost_to_noscript_is_sent_again(index, layout, valkey, clock):
    written(index, layout, [1, 2])
    clock.advance(index.TOUCH_INTERVAL_S + 5)
    index.read(layout, [1], MODE_PREFIX)  # loads lua/touch.lua with its first refresh
    index.settle()
    valkey.script_flush()  # as a restarted or failed-over Valkey
    clock.advance(index.TOUCH_INTERVAL_S + 5)
    index.read(layout, [1, 2], MODE_PREFIX)
    index.settle()
    assert access_times(index, layout, [1, 2]) == [int(clock.now())] * 2


def test_a_reader_whose_bucket_count_is_out_of_date_reads_the_moved_keys_again(index, layout, valkey, clock):
    reader = BlockIndex(valkey, index.prefix, clock)
    first = list(range(1, 41))
    written(index, layout, first)
    assert len(reader.read_raw(layout, first, MODE_PREFIX)) == 40
    count = reader._bucket_counts.get(layout.tag) or 1 << layout.bucket_bits
    more = list(range(1000, 1400))
    for i in range(0, len(more), 100):
        written(index, layout, more[i : i + 100], sid=f"more{i}")
    assert index.bucket_count(layout) > count  # the starts split buckets
    keys = first + more
    now = index.bucket_count(layout)
    moved = sum(bucket_index(k, count) != bucket_index(k, now) for k in keys)
    assert 0 < moved < len(keys)
    valkey.config_resetstat()
    assert [r is not None for r in reader.read_raw(layout, keys, MODE_BATCH)] == [True] * len(keys)
    assert reader._bucket_counts[layout.tag] == now
    # the second exchange asks only for the keys whose bucket a split moved
    assert (calls(valkey)["exec"], calls(valkey)["hget"]) == (2, len(keys) + moved)


def test_a_connection_dropped_by_the_server_is_retried_once(index, layout, valkey, valkey_url):
    written(index, layout, [1, 2, 3])
    assert len(index.read_raw(layout, [1, 2, 3], MODE_PREFIX)) == 3
    killer = redis.Redis.from_url(valkey_url)
    assert killer.client_kill_filter(_type="normal", skipme=True) >= 1
    killer.close()
    assert len(index.read_raw(layout, [1, 2, 3], MODE_PREFIX)) == 3


def test_threads_reading_and_refreshing_share_the_index_and_return_every_connection(index, layout, valkey, clock):
    keys = list(range(1, 257))
    for i in range(0, 256, 64):
        written(index, layout, keys[i : i + 64], sid=f"w{i}")
    written_at = int(clock.now())
    errors = []

    def reader(offset):
        try:
            for turn in range(60):
                if turn % 10 == 0:
                    clock.advance(index.TOUCH_INTERVAL_S + 1)  # every key due again
                chosen = keys[offset : offset + 128]
                assert len(index.read_raw(layout, chosen, MODE_PREFIX)) == 128
        except Exception as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(o,)) for o in (0, 32, 64, 96, 128, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    index.settle()
    assert not index._parked
    pool = valkey.connection_pool
    assert len(pool._in_use_connections) == 0
    assert all(t > written_at for t in access_times(index, layout, keys))  # each refreshed


def test_a_deferred_reply_refused_is_raised_once_every_reply_is_read(valkey):
    # A refresh sent with its script (SCRIPT LOAD, then EVALSHA): a refused first command must
    # not leave the second's reply on the connection for the pool's next user.
    from chalicelib.resp import command
    from chalicelib.valkey import Deferred

    valkey.connection_pool.disconnect()
    sent = Deferred(valkey, b"k", command(b"SCRIPT", b"LOAD", b"this is not lua") + command(b"ECHO", b"mine"), 2)
    try:
        sent.collect()
    except redis.ResponseError as exc:
        assert "Error compiling script" in str(exc)
    else:
        raise AssertionError("the refusal was not raised")
    assert len(valkey.connection_pool._available_connections) == 1  # back in the pool
    assert valkey.echo("next") == b"next"  # its own reply, not the deferred one


def test_a_long_read_on_a_server_busy_with_another_script_is_unavailable_at_once(valkey, valkey_url, clock):
    # Every command but MULTI is refused while another client's script runs: 131 refusals,
    # more bytes than a few lines, end the read all the same, not the socket timeout.
    reader = BlockIndex(redis.Redis.from_url(valkey_url, socket_timeout=5), "t", clock)
    layout = reader.layout("inst", 4)
    keys = list(range(1, 129))
    written(reader, layout, keys)
    assert len(reader.read_raw(layout, keys, MODE_PREFIX)) == 128
    with busy_valkey(valkey_url):
        started = time.monotonic()
        with pytest.raises(ValkeyUnavailableError, match="BUSY"):
            reader.read_raw(layout, keys, MODE_PREFIX)
        assert time.monotonic() - started < 2
    assert len(reader.read_raw(layout, keys, MODE_PREFIX)) == 128
