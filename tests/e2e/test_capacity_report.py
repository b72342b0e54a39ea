"""getCapacityReport against the local stack: the newest sweep's curves and recommendation."""

from __future__ import annotations

import json
import uuid

import pytest

from kvcm_client import KvcmClient
from local_stack import LocalStack

from .harness import run_execution

SWEEP = "optimizer_sweep"


def test_the_latest_sweep_report_is_served(stack: LocalStack, tmp_path):
    s3 = stack.aws.client("s3")
    bucket = f"sweeps-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    trace = "".join(
        json.dumps({"timestamp": t * 1000, "input_length": 2048, "output_length": 10, "hash_ids": ids}) + "\n"
        for t, ids in enumerate([[1, 2, 3, 4], [1, 2, 5, 6], [1, 2, 3, 4], [1, 2, 5, 7]] * 3)
    )
    s3.put_object(Bucket=bucket, Key="trace.jsonl", Body=trace.encode())
    with KvcmClient(stack.api_url) as client:
        sweep = {
            "trace": {"bucket": bucket, "key": "trace.jsonl", "format": "mooncake"},
            "capacities": [2, 4, 100],
            "policies": ["lru", "lfu"],
            "output": {"bucket": bucket, "prefix": "r1"},
        }
        execution = run_execution(stack, SWEEP, sweep, timeout_s=120)
        assert execution["status"] == "SUCCEEDED", execution
        report = client.get_capacity_report()
    assert report.execution_name == execution["name"] and report.report_uri == f"s3://{bucket}/r1/report.json"
    assert [c.policy for c in report.curves] == ["lfu", "lru"]
    lru = report.curves[1]
    assert lru.capacities == [2, 4, 100]
    assert lru.block_hit_ratio[0] <= lru.block_hit_ratio[1] <= lru.block_hit_ratio[2]
    # 48 block reads; with room for all 7 blocks, every read after a block's first is a hit.
    assert lru.block_hit_ratio[2] == pytest.approx((48 - 7) / 48, abs=1e-4)  # the report rounds
    assert report.recommendation is not None and report.recommendation.capacity in (2, 4, 100)
    assert 0 < report.target_hit_ratio <= lru.block_hit_ratio[2]
