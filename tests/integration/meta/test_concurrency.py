"""16 threads start and finish writes on overlapping prefixes against real Valkey.

Each key is granted to one session at a time: a key whose write succeeded is never
granted again, and a key is granted once more only after a failed write deleted it.
At the end the usage counters equal the sums recomputed from the stored records.
"""

import os
import random
import threading
import time
from collections import Counter

import pytest

from chalicelib.index.records import decode_record
from chalicelib.protocol.models import BlockMask, BoolMasks, FinishWriteCacheRequest, StartWriteCacheRequest

DURATION_S = float(os.environ.get("KVCM_SOAK_S", "60"))
THREADS = 16


@pytest.mark.slow  # a soak: KVCM_SOAK_S of real time (60 s by default)
def test_concurrent_writers_are_exclusive_and_usage_exact(runtime, instance):
    cache = runtime.cache
    grants, successes = Counter(), Counter()
    lock = threading.Lock()
    errors = []
    deadline = time.monotonic() + DURATION_S

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            while time.monotonic() < deadline:
                root = rng.randrange(400)  # few roots for many threads: heavy prefix overlap
                keys = [root * 1_000_000 + i for i in range(rng.randrange(1, 24))]
                start = cache.start_write_cache(StartWriteCacheRequest(instance_id="i1", block_keys=keys))
                mask = start.block_mask
                new = (
                    [i >= mask.offset for i in range(len(keys))]
                    if mask.offset is not None
                    else [not v for v in mask.bool_masks.values]
                )
                granted = [k for k, n in zip(keys, new, strict=True) if n]
                assert len(granted) == len(start.locations)
                ok = [rng.random() < 0.9 for _ in granted]
                with lock:
                    grants.update(granted)
                    successes.update(k for k, s in zip(granted, ok, strict=True) if s)
                cache.finish_write_cache(
                    FinishWriteCacheRequest(
                        instance_id="i1",
                        write_session_id=start.write_session_id,
                        success_blocks=BlockMask(bool_masks=BoolMasks(values=ok)),
                    )
                )
        except Exception as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert sum(grants.values()) > 1000
    assert all(successes[k] <= 1 for k in successes), "a key was written successfully twice"

    ctx = runtime.contexts("i1")
    stored = {key: decode_record(raw) for key, raw in runtime.index.scan(ctx.layout)}
    assert set(stored) == {k for k in successes if successes[k]}
    sizes = ctx.spec_layout.sizes
    usage = runtime.index.usage([ctx.layout])[0]
    assert usage.keys == len(stored)
    assert usage.bytes == sum(sizes[loc.spec_group] for rec in stored.values() for loc in rec.locations)
    assert usage.by_type == {"ST_NFS": usage.bytes}
