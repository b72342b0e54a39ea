"""Where the Valkey time of a 128-key read goes, and what the layouts that could cut it cost.

An instance's reads all run on one shard's single thread, so Valkey's time per read caps
an instance. This bench measures, in turns in one run on 100,000 two-spec records (the
layout of bench_meta.py (e)), the read as shipped (index/reads.py: no script, MULTI and one
HGET per key from the client; its Valkey time is MULTI's and EXEC's, EXEC's holding the
HGETs), the same with every key's recency due (lua/touch.lua sent after it), and the script
reads it replaced and the options of docs/index-read-path.md: one HGET per key in a script
(the floor of the read script before, lua/read.lua, within 5 % of it), one EXISTS per key
(the floor of any script making a call per key), one HMGET per distinct bucket, and the
alternative layouts (one string key per record, packed string buckets, one hash per
instance: one multi-key or multi-field command per read) with their memory. Baseline: a
client MGET of the same 128 keys, and every figure as a multiple of it.

    .venv/bin/python bench/bench_read_path.py
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import tempfile
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import ValkeyTime, valkey_server
from bench.bench_meta import build_runtime, write_blocks

N = 128
BLOCKS = 100_000
ROUNDS, CALLS = 5, 200
#: Records per bucket of the "big buckets" option (past hash-max-listpack-entries).
BIG_BUCKET_RECORDS = 4096

# Each option is a script over KEYS (one name per key unless said) and ARGV[1] (the keys blob).
HGET_GIVEN_NAMES = """
local keys, sub, call = ARGV[1], string.sub, redis.call
for i = 1, #keys / 8 do call('HGET', KEYS[i], sub(keys, i * 8 - 7, i * 8)) end
return 1"""
HGET_NAMES_IN_LUA = """
local keys, sub, call = ARGV[1], string.sub, redis.call
local prefix, nbuckets = ARGV[2], tonumber(ARGV[3])
for i = 1, #keys / 8 do
  local key = sub(keys, i * 8 - 7, i * 8)
  call('HGET', bucket_of(prefix, nbuckets, key), key)
end
return 1"""
EMPTY = """
return 1"""
EXISTS_PER_KEY = """
local call = redis.call
for i = 1, #ARGV[1] / 8 do call('EXISTS', KEYS[i]) end
return 1"""
HMGET_PER_BUCKET = """
local keys, sub, call = ARGV[1], string.sub, redis.call
local fields, order = {}, {}
for i = 1, #keys / 8 do
  local bucket = KEYS[i]
  local list = fields[bucket]
  if not list then list = {} fields[bucket] = list order[#order + 1] = bucket end
  list[#list + 1] = sub(keys, i * 8 - 7, i * 8)
end
for _, bucket in ipairs(order) do call('HMGET', bucket, unpack(fields[bucket])) end
return #order"""
MGET_STRING_RECORDS = """
return #redis.call('MGET', unpack(KEYS))"""
HMGET_ONE_HASH = """
local keys, sub = ARGV[1], string.sub
local fields = {}
for i = 1, #keys / 8 do fields[i] = sub(keys, i * 8 - 7, i * 8) end
return #redis.call('HMGET', KEYS[1], unpack(fields))"""
# A prefix read on one hash with less Lua work per key: the keys as ARGV[2..] (no field
# named in Lua), a status and a recency check per record, the HMGET reply returned as it
# came (Valkey ends an array reply at its first nil: the prefix's end). ARGV[1]: the stale
# time.
LEAN_READ_ONE_HASH = """
local found = redis.call('HMGET', KEYS[1], unpack(ARGV, 2))
local stale, due = tonumber(ARGV[1]), 0
for i = 1, #ARGV - 1 do
  local rec = found[i]
  if not rec or string.byte(rec, loc_pos(1) + L_STATUS) ~= SERVING then
    found[i] = nil
    break
  end
  if struct.unpack(H_LAST_ACCESS_S_FMT, rec, H_LAST_ACCESS_S) <= stale then due = due + 1 end
end
return found"""
# KEYS: the distinct buckets; ARGV[2]: per key, the 1-based index of its bucket (a byte).
# A packed bucket is a string of entries: 8-byte key, 1-byte length, record.
FIND_IN_PACKED_BUCKETS = """
local keys, sub, byte, find = ARGV[1], string.sub, string.byte, string.find
local packed = redis.call('MGET', unpack(KEYS))
local found = 0
for i = 1, #keys / 8 do
  local key = sub(keys, i * 8 - 7, i * 8)
  local bucket = packed[byte(ARGV[2], i)]
  local at = find(bucket, key, 1, true)
  -- a match must start an entry: walk the entries when it does not (rare)
  local pos = 1
  while at and at ~= pos do
    while pos < at do pos = pos + 9 + byte(bucket, pos + 8) end
    if pos ~= at then at = find(bucket, key, at + 1, true) end
  end
  if at then
    found = found + 1
    local rec = sub(bucket, at + 9, at + 8 + byte(bucket, at + 8))
  end
end
return found"""


def main() -> None:
    from chalicelib.clock import ManualClock
    from chalicelib.index.block_index import BlockIndex
    from chalicelib.index.layout import lua_constants
    from chalicelib.index.scripts import LUA_DIR
    from chalicelib.index.types import MODE_PREFIX, bucket_index, pack_keys

    prelude = lua_constants() + (LUA_DIR / "prelude.lua").read_text()
    with valkey_server() as client, tempfile.TemporaryDirectory() as data_dir:
        rt, aws = build_runtime(client, data_dir, capacity_blocks=BLOCKS)
        try:
            from chalicelib.observability.logging import logger

            logger.registered_handler.setStream(open(os.devnull, "w"))
            rng = random.Random(11)
            keys = [rng.getrandbits(63) for _ in range(BLOCKS)]
            bucket_bytes = client.info("memory")["used_memory"]
            write_blocks(rt, keys)
            bucket_bytes = (client.info("memory")["used_memory"] - bucket_bytes) / BLOCKS
            ctx = rt.contexts("bench")
            layout, index = ctx.layout, rt.index
            bucket_count = index.bucket_count(layout)

            def bucket_of(key: int) -> bytes:
                return layout.bucket(bucket_index(key, bucket_count))

            records = dict(index.scan(layout))
            string_bytes = client.info("memory")["used_memory"]
            for start in range(0, BLOCKS, 1000):
                client.mset(
                    {
                        layout.key("r:") + k.to_bytes(8, "big", signed=True): records[k]
                        for k in keys[start : start + 1000]
                    }
                )
            string_bytes = (client.info("memory")["used_memory"] - string_bytes) / BLOCKS
            # Every record in one hash: past hash-max-listpack-entries Valkey keeps it as a
            # hashtable, whose lookups do not scan (a listpack bucket's do).
            one_hash = layout.key("all")
            one_hash_bytes = client.info("memory")["used_memory"]
            for start in range(0, BLOCKS, 1000):
                client.hset(
                    one_hash,
                    mapping={k.to_bytes(8, "big", signed=True): records[k] for k in keys[start : start + 1000]},
                )
            one_hash_bytes = (client.info("memory")["used_memory"] - one_hash_bytes) / BLOCKS
            one_hash_encoding = client.object("encoding", one_hash).decode()
            # The middle way: buckets as today, sized past the listpack limit (hashtables).
            big_buckets = BLOCKS // BIG_BUCKET_RECORDS
            big_bucket_of = [layout.key("big:") + b"%x" % (k % big_buckets) for k in keys]
            big_bytes = client.info("memory")["used_memory"]
            for start in range(0, BLOCKS, 1000):
                pipe = client.pipeline(transaction=False)
                for k, name in zip(keys[start : start + 1000], big_bucket_of[start : start + 1000], strict=True):
                    pipe.hset(name, k.to_bytes(8, "big", signed=True), records[k])
                pipe.execute()
            big_bytes = (client.info("memory")["used_memory"] - big_bytes) / BLOCKS
            packed: dict[bytes, list[bytes]] = {}
            for k in keys:
                record = records[k]
                packed.setdefault(layout.key("p:") + bucket_of(k)[len(layout.bucket_prefix) :], []).append(
                    k.to_bytes(8, "big", signed=True) + bytes([len(record)]) + record
                )
            packed_bytes = client.info("memory")["used_memory"]
            client.mset({name: b"".join(entries) for name, entries in packed.items()})
            packed_bytes = (client.info("memory")["used_memory"] - packed_bytes) / BLOCKS

            batches = [keys[i * N : (i + 1) * N] for i in range(BLOCKS // N)]
            buckets = [[bucket_of(k) for k in batch] for batch in batches]
            distinct = statistics.mean(len(set(b)) for b in buckets)
            big_names = [big_bucket_of[i * N : (i + 1) * N] for i in range(len(batches))]
            big_distinct = statistics.mean(len(set(b)) for b in big_names)
            scripts = {
                name: client.register_script(prelude + "\n" + src)
                for name, src in (
                    ("hget", HGET_GIVEN_NAMES),
                    ("hget_lua_names", HGET_NAMES_IN_LUA),
                    ("empty", EMPTY),
                    ("exists", EXISTS_PER_KEY),
                    ("hmget", HMGET_PER_BUCKET),
                    ("mget_strings", MGET_STRING_RECORDS),
                    ("packed", FIND_IN_PACKED_BUCKETS),
                    ("one_hash", HMGET_ONE_HASH),
                    ("lean_one_hash", LEAN_READ_ONE_HASH),
                )
            }
            packed_reads = []
            for batch in batches:
                names = list(dict.fromkeys(layout.key("p:") + bucket_of(k)[len(layout.bucket_prefix) :] for k in batch))
                position = {name: i + 1 for i, name in enumerate(names)}
                packed_reads.append(
                    (
                        names,
                        bytes(position[layout.key("p:") + bucket_of(k)[len(layout.bucket_prefix) :]] for k in batch),
                    )
                )
            assert scripts["packed"](keys=packed_reads[0][0], args=[pack_keys(batches[0]), packed_reads[0][1]]) == N
            lean_args = [0, *(k.to_bytes(8, "big", signed=True) for k in batches[0])]
            assert scripts["lean_one_hash"](keys=[one_hash], args=lean_args) == [records[k] for k in batches[0]]

            def cycling(fn):
                position = [0]

                def call():
                    i = position[0] % len(batches)
                    position[0] += 1
                    return fn(i)

                return call

            def script(name, names_of):
                return cycling(
                    lambda i: scripts[name](
                        keys=names_of(i), args=[pack_keys(batches[i]), layout.bucket_prefix, bucket_count]
                    )
                )

            timer = ValkeyTime(client)

            def read(chosen_index, i):
                """A read as read_raw sends it (its Valkey time MULTI's and EXEC's, EXEC's own
                holding the HGETs it runs), and lua/touch.lua when it follows (its reply read
                here, as the index's next read would)."""
                chosen_index.read_raw(layout, batches[i], MODE_PREFIX, servable=ctx.servable)
                chosen_index.settle()

            # A second index on a clock running 2 s ahead per call: every read finds every
            # key's recency due and rewrites each record (one HSET per key). Its stamps lie in
            # the future for the real clock, so the shipped read below never finds one due.
            due_clock = ManualClock(rt.clock.now())
            due_index = BlockIndex(client, index.prefix, due_clock)

            def due_read(i):
                due_clock.advance(2)
                return read(due_index, i)

            for i in range(len(batches)):
                due_read(i)

            options = {
                "client MGET of 128 string keys (baseline)": cycling(
                    lambda i: client.mget([layout.key("r:") + k.to_bytes(8, "big", signed=True) for k in batches[i]])
                ),
                "read as shipped (MULTI, HGET per key; no refresh due)": cycling(partial(read, index)),
                "  the same, every key's recency due (+ lua/touch.lua)": cycling(due_read),
                "fixed cost of a script: an empty one with 130 KEYS": script(
                    "empty", lambda i: [layout.key("m"), layout.key("st"), *buckets[i]]
                ),
                "one HGET per key in a script (lua/read.lua's floor)": script("hget", lambda i: buckets[i]),
                "one HGET per key, bucket names built in Lua (before)": script(
                    "hget_lua_names", lambda i: [layout.key("m")]
                ),
                "floor of any per-key call: one EXISTS per key": script("exists", lambda i: buckets[i]),
                f"one HMGET per distinct bucket ({distinct:.1f} of 128)": script("hmget", lambda i: buckets[i]),
                "string key per record: one MGET in Lua": script(
                    "mget_strings", lambda i: [layout.key("r:") + k.to_bytes(8, "big", signed=True) for k in batches[i]]
                ),
                f"one {one_hash_encoding} hash per instance: one HMGET": script("one_hash", lambda i: [one_hash]),
                "  a prefix read on it, keys as ARGV, reply as HMGET's": cycling(
                    lambda i: scripts["lean_one_hash"](
                        keys=[one_hash], args=[0, *(k.to_bytes(8, "big", signed=True) for k in batches[i])]
                    )
                ),
                "  the client's HMGET of the 128 fields (no script)": cycling(
                    lambda i: client.hmget(one_hash, [k.to_bytes(8, "big", signed=True) for k in batches[i]])
                ),
                f"{big_buckets} buckets of {BIG_BUCKET_RECORDS}: HMGET per bucket ({big_distinct:.1f} of 128)": script(
                    "hmget", lambda i: big_names[i]
                ),
                "packed string buckets: one MGET, keys found by string.find": cycling(
                    lambda i: scripts["packed"](
                        keys=packed_reads[i][0], args=[pack_keys(batches[i]), packed_reads[i][1]]
                    )
                ),
            }
            samples = {name: [] for name in options}
            for _ in range(ROUNDS):
                for name, fn in options.items():
                    samples[name].append(timer.measure(fn, CALLS))
            print(
                f"Valkey time per {N}-key read, {BLOCKS:,} two-spec records in {bucket_count} buckets, "
                f"median of {ROUNDS} batches of {CALLS} calls, {os.cpu_count()} cores"
            )
            print(f"  {'':<58} {'wall µs':>9} {'Valkey µs':>10} {'× MGET':>7} {'CPU µs':>9}")
            baseline = statistics.median(run[1] for run in next(iter(samples.values())))
            for name, runs in samples.items():
                wall, server, cpu = (statistics.median(run[i] for run in runs) for i in range(3))
                print(f"  {name:<58} {wall:>9.1f} {server:>10.1f} {server / baseline:>7.2f} {cpu:>9.1f}")
            print("Memory per block (records, counters, bucket or key overhead)")
            print(f"  {'records in bucket hashes (the layout)':<58} {bucket_bytes:>9.1f} B")
            print(f"  {'one string key per record':<58} {string_bytes:>9.1f} B")
            print(f"  {'packed string buckets (records only, no counters)':<58} {packed_bytes:>9.1f} B")
            print(f"  {f'one {one_hash_encoding} hash per instance (records only)':<58} {one_hash_bytes:>9.1f} B")
            print(f"  {f'{big_buckets} buckets of {BIG_BUCKET_RECORDS} (records only)':<58} {big_bytes:>9.1f} B")
        finally:
            aws.stop()


if __name__ == "__main__":
    main()
