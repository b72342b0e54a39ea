"""Valkey memory per block at several fills of one instance of a 100 GiB group.

One-spec blocks of 64 KiB: the group's quota holds 1.6 million of them per instance. Each
fill (1,000, 31,000 and 1,000,000 blocks) is written through the index's start and
finish scripts, 128 keys per start, into three key spaces in turn on the same Valkey:

- buckets grown with the records (as shipped: 16 at first, split as the records pass
  ``BlockIndex.RECORDS_PER_BUCKET`` per bucket);
- buckets fixed at the group's quota, as registration sized them before (2^15 for
  1.6 million blocks at 64 per bucket: meta 'n' set to it before writing, so none split);
- upstream's layout (baseline): a hash per block holding its locations' JSON.

Memory is ``used_memory`` after the writes less before them (FLUSHALL between), records,
counters and the occupied-bucket set included; sessions are gone once finished. Fills
under 100,000 are measured twice, the smaller figure kept.

    .venv/bin/python bench/bench_memory.py [--fills 1000,31000,1000000]
"""

from __future__ import annotations

import argparse
import json
import random
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


def write(index, layout, keys: list[int]) -> None:
    from chalicelib.index.block_index import StartRequest

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
    fills = [int(f) for f in parser.parse_args().fills.split(",")]

    from chalicelib.clock import ManualClock
    from chalicelib.index import BlockIndex
    from chalicelib.index.block_index import FIRST_BUCKET_BITS

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


if __name__ == "__main__":
    main()
