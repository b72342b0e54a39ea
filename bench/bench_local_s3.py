"""What keeping moto's S3 on disk costs the local stack: the median latency of PutObject
(blocks of a few sizes, through boto3 over HTTP) with the S3 mirror attached (the object
written under ``state_dir/s3`` before moto answers) beside the same calls with it detached
(the baseline: moto in memory only, what the stack did before), sampled in turns.

    .venv/bin/python bench/bench_local_s3.py [rounds]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from local_stack import LocalStack, StackConfig

PER_ROUND = 10
SIZES = (64 << 10, 1 << 20, 8 << 20)


def timed_puts(s3: Any, body: bytes, tag: str) -> list[float]:
    """Seconds per PutObject of ``PER_ROUND`` objects of ``body``."""
    samples = []
    for n in range(PER_ROUND):
        t0 = time.perf_counter()
        s3.put_object(Bucket="bench", Key=f"{tag}/{n}", Body=body)
        samples.append(time.perf_counter() - t0)
    return samples


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    with tempfile.TemporaryDirectory() as state:
        config = replace(StackConfig.from_env(), state_dir=Path(state), port=0, aws_port=0, snapshot_period_s=0)
        with LocalStack(config) as stack:
            s3, mirror = stack.aws.client("s3"), stack.s3_mirror
            assert mirror is not None
            s3.create_bucket(Bucket="bench")
            print(f"PutObject latency over HTTP, median of {rounds * PER_ROUND} calls each")
            for size in SIZES:
                body = os.urandom(size)
                timed_puts(s3, body, f"warmup-{size}")
                on, off = [], []
                for round_ in range(rounds):  # in turns: a machine that slows down moves both alike
                    on += timed_puts(s3, body, f"on-{size}-{round_}")
                    mirror.detach()
                    off += timed_puts(s3, body, f"off-{size}-{round_}")
                    mirror.attach()
                base, kept = statistics.median(off) * 1e3, statistics.median(on) * 1e3
                print(
                    f"  {size >> 10:>6} KiB  in memory only (baseline) {base:>8.2f} ms   kept on disk {kept:>8.2f} ms"
                    f"  (+{kept - base:.2f} ms, {kept / base:.2f}x)"
                )


if __name__ == "__main__":
    main()
