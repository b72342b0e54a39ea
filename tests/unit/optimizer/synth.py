"""Random prefix-chained traces for property tests (seeded: every failure reproduces)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from chalicelib.optimizer.traces import Op, Query, Record


def random_trace(
    seed: int, *, requests: int = 150, instances: tuple[str, ...] = ("a", "b"), max_new: int = 6, mixed: bool = False
) -> list[Record]:
    """Requests over a random prefix tree per instance.

    Each request extends a random prefix of an earlier path with fresh keys, so a key always
    has the same parent. ``mixed`` adds reads with block masks, batch-get and sliding-window
    queries, standalone writes with holes (partial success) and duplicate keys.
    """
    rng = random.Random(seed)
    paths: dict[str, list[list[int]]] = {name: [] for name in instances}
    fresh = iter(range(1, 10**9))
    records: list[Record] = []
    for i in range(requests):
        instance = rng.choice(instances)
        known = paths[instance]
        base: list[int] = []
        if known and rng.random() < 0.8:
            path = rng.choice(known)
            base = path[: rng.randint(1, len(path))]
        keys = base + [next(fresh) for _ in range(rng.randint(0 if base else 1, max_new))]
        known.append(keys)
        ts = i * 7_000_000  # 7 s apart: several time windows
        if not mixed:
            records.append(Record(instance, ts, Op.REQUEST, keys, 0, 0))
            continue
        kind = rng.random()
        if kind < 0.5:
            records.append(
                Record(instance, ts, Op.REQUEST, keys, 0, rng.choice([0, len(keys) * 4 - rng.randint(0, 3)]))
            )
        elif kind < 0.8:
            query = rng.choice([Query.PREFIX_MATCH, Query.PREFIX_MATCH, Query.BATCH_GET, Query.REVERSE_ROLL_SW_MATCH])
            mask = rng.choice([0, rng.randint(0, len(keys)), tuple(rng.random() < 0.3 for _ in keys)])
            records.append(Record(instance, ts, Op.READ, keys, mask, 0, query, rng.randint(1, 3)))
        else:
            skipped = rng.choice([0, tuple(rng.random() < 0.3 for _ in keys)])
            written = keys + keys[-1:] if rng.random() < 0.1 and keys else keys
            records.append(Record(instance, ts, Op.WRITE, written, skipped))
    return records


def write_mooncake_trace(path: Path, seed: int, requests: int = 400) -> Path:
    """``random_trace`` (one instance) as a Mooncake JSONL file: what the CLI reads."""
    with open(path, "w") as out:
        for record in random_trace(seed, requests=requests, instances=("a",)):
            out.write(json.dumps({"timestamp": record.timestamp_us // 1000, "hash_ids": list(record.keys)}) + "\n")
    return path
