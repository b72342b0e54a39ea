"""Valkey memory per block at several fills of one instance of a 100 GiB group.

One-spec blocks of 64 KiB: the group's quota holds 1.6 million of them per instance. Each
fill (1,000, 31,000 and 1,000,000 blocks) is written through the index's start and
finish scripts, 128 keys per start, into three key spaces in turn on the same Valkey:

- buckets grown with the records (as shipped: 16 at first, split as the records pass
  ``BlockIndex.RECORDS_PER_BUCKET`` per bucket);
- buckets fixed at the group's quota, as registration sized them before (2^15 for
  1.6 million blocks at 64 per bucket: meta 'n' set to it before writing, and no split);
- upstream's layout (baseline): a hash per block holding its locations' JSON.

Memory is ``used_memory`` after the writes less before them (FLUSHALL between), records,
counters and the occupied-bucket set included; sessions are gone once finished. Fills
under 100,000 are measured twice, the smaller figure kept.

Last, the fill sweep behind ``BlockIndex.RECORDS_PER_BUCKET``: 31,000 blocks held at 1 to
64 records per bucket, the Valkey time of an HGET and of a 128-key prefix read at each
(a listpack lookup scans its bucket), beside an MGET of the same keys, and the memory.

    .venv/bin/python bench/bench_memory.py [--fills 1000,31000,1000000] [--sweep-only]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis

from bench._common import row, valkey_server

SPEC_BYTES = 64 << 10
GROUP_QUOTA = 100 << 30
#: Buckets registration gave such an instance before they grew: 1.6 M blocks / 64 a bucket.
QUOTA_SIZED_BUCKETS = 1 << 15
PER_START = 128
SMALL_FILL = 100_000
#: Records per bucket of the fill sweep, and its rounds of reads.
SWEEP_FILLS = (1, 4, 8, 16, 32, 64)
SWEEP_ROUNDS, SWEEP_CALLS = 7, 150


def write(index, layout, keys: list[int]) -> None:
    from chalicelib.index.types import StartRequest

    for n in range(0, len(keys), PER_START):
        chunk = keys[n : n + PER_START]
        sid = f"s{n}"
        index.start(layout, chunk, StartRequest(sid, 2**47, "nfs_01", "ST_NFS", 0, [SPEC_BYTES], [0] * len(chunk)))
        session = index.session(layout, sid)
        index.finish(layout, sid, session, [True] * len(session.entries), [SPEC_BYTES])


def upstream_json(key: int) -> str:
    return json.dumps(
        [
            {
                "location_id": f"{key:x}",
                "status": 3,
                "type": "ST_NFS",
                "spec_size": 1,
                "location_specs": [
                    {
                        "name": "tp0",
                        "uri": f"file://nfs_01/data/bench/tp0/{key & 0xFFFFFFFF:08x}?blkid=0&size={SPEC_BYTES}",
                    }
                ],
            }
        ]
    )


def used(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fills", default="1000,31000,1000000")
    parser.add_argument("--sweep-only", action="store_true", help="only the fill sweep")
    args = parser.parse_args()
    fills = [] if args.sweep_only else [int(f) for f in args.fills.split(",")]

    from chalicelib.clock import ManualClock
    from chalicelib.index import BlockIndex
    from chalicelib.index.types import FIRST_BUCKET_BITS

    print(
        f"Valkey memory per one-spec block ({SPEC_BYTES >> 10} KiB), one instance of a "
        f"{GROUP_QUOTA >> 30} GiB group ({GROUP_QUOTA // SPEC_BYTES:,} blocks at most)"
    )
    with valkey_server() as client:
        index = BlockIndex(client, "kvcm", ManualClock(1_000_000))
        # Load the scripts first: Valkey's script cache is not the blocks' memory.
        write(index, index.claim("warm", "inc-1", FIRST_BUCKET_BITS, registering=True), [1, 2])
        client.execute_command("FLUSHALL", "SYNC")
        for fill in fills:
            rng = random.Random(fill)
            keys = [rng.getrandbits(63) for _ in range(fill)]
            figures = {}
            # Small fills twice, the smaller kept: some tens of KB Valkey allocates once in a
            # run (not the blocks') would otherwise weigh on the first.
            for name, fixed in (("grown", False), ("quota", True)) * (2 if fill < SMALL_FILL else 1):
                client.execute_command("FLUSHALL", "SYNC")
                before = used(client)
                layout = index.claim("bench", "inc-1", FIRST_BUCKET_BITS, registering=True)
                if fixed:
                    client.hset(layout.key("m"), "n", QUOTA_SIZED_BUCKETS)
                # Buckets registered before did not split (such a key space grows now).
                index.RECORDS_PER_BUCKET = 1 << 30 if fixed else BlockIndex.RECORDS_PER_BUCKET
                write(index, layout, keys)
                measured = ((used(client) - before) / fill, index.bucket_count(layout))
                figures[name] = min(figures.get(name, measured), measured)
            client.execute_command("FLUSHALL", "SYNC")
            before = used(client)
            for n in range(0, fill, 1000):
                pipe = client.pipeline(transaction=False)
                for key in keys[n : n + 1000]:
                    pipe.hset(b"upstream:bench:%d" % key, mapping={"locations": upstream_json(key), "write_ts": 1})
                pipe.execute()
            upstream = (used(client) - before) / fill
            client.execute_command("FLUSHALL", "SYNC")
            print(f"({fill:,} blocks)")
            print(row("upstream layout: a hash per block, locations JSON (baseline)", upstream, unit="B"))
            for name, label in (("quota", "quota-sized (before)"), ("grown", "grown (now)")):
                per_block, buckets = figures[name]
                text = f"KVCM, buckets {label}: {buckets:,}, {fill / buckets:.2f} records each"
                print(row(text, per_block, upstream, unit="B"))
        per_bucket_sweep(client, index)


def per_bucket_sweep(client: redis.Redis, index) -> None:
    """What a bucket's fill costs a read: at 31,000 blocks, buckets held at each fill (meta
    'n' fixed), the Valkey time of an HGET and of the 128-key prefix read script
    (commandstats, in turns), beside an MGET of the same 128 keys, and the memory."""
    from chalicelib.index import InstanceLayout
    from chalicelib.index.types import FIRST_BUCKET_BITS, MODE_PREFIX

    count = 31_000
    rng = random.Random(5)
    keys = [rng.getrandbits(63) for _ in range(count)]
    batches = [keys[i * PER_START : (i + 1) * PER_START] for i in range(count // PER_START)]
    index.RECORDS_PER_BUCKET = 1 << 30  # the fills stay as set: no split

    def held_at(per: int) -> InstanceLayout:
        layout = index.claim(f"r{per}", "inc-1", FIRST_BUCKET_BITS, registering=True)
        client.hset(layout.key("m"), "n", max(16, -(-count // per)))
        write(index, layout, keys)
        index.read_raw(layout, keys[:PER_START], MODE_PREFIX)  # the client learns the count
        return layout

    memory = {}
    for per in SWEEP_FILLS:  # each alone, as the fills above (the key table grows in steps)
        client.execute_command("FLUSHALL", "SYNC")
        before = used(client)
        held_at(per)
        memory[per] = (used(client) - before) / count
    client.execute_command("FLUSHALL", "SYNC")
    client.mset({b"mget:%d" % k: b"x" * 40 for k in keys})
    layouts = {per: held_at(per) for per in SWEEP_FILLS}
    runs: dict[object, list[tuple[float, float]]] = {per: [] for per in [*SWEEP_FILLS, "mget"]}
    for r in range(SWEEP_ROUNDS):
        for per in runs:
            client.config_resetstat()
            for i in range(SWEEP_CALLS):
                batch = batches[(r * SWEEP_CALLS + i) % len(batches)]
                if per == "mget":
                    client.mget([b"mget:%d" % k for k in batch])
                else:
                    index.read_raw(layouts[per], batch, MODE_PREFIX)
            stats = client.info("commandstats")
            if per == "mget":
                runs[per].append((0.0, stats["cmdstat_mget"]["usec_per_call"]))
            else:
                runs[per].append((stats["cmdstat_hget"]["usec_per_call"], stats["cmdstat_evalsha"]["usec_per_call"]))
    mget = statistics.median(t for _, t in runs["mget"])
    print(
        f"({count:,} blocks at fixed fills: Valkey µs per HGET and per 128-key prefix read, "
        f"median of {SWEEP_ROUNDS} x {SWEEP_CALLS} in turns; memory)"
    )
    print(row("MGET of the same 128 keys (baseline)", mget))
    for per in SWEEP_FILLS:
        hget = statistics.median(h for h, _ in runs[per])
        read = statistics.median(t for _, t in runs[per])
        print(row(f"{per:>2} records per bucket: read (HGET {hget:.2f} µs), {memory[per]:.1f} B per block", read, mget))


if __name__ == "__main__":
    main()
