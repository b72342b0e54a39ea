"""The optimizer's Lambda task logic against S3 (moto, real boto3 calls)."""

from __future__ import annotations

import json

import boto3
import pytest
from moto import mock_aws

from chalicelib.optimizer.errors import ConfigError
from chalicelib.optimizer.replay import replay
from chalicelib.optimizer.sweep import SweepSettings
from chalicelib.optimizer.tasks import report_task, run_task
from chalicelib.optimizer.traces import read_trace
from tests.helpers import CONVERSATION

BUCKET = "kvcm-optimizer-test"
KEY = "traces/mooncake_conversation.jsonl"


@pytest.fixture
def s3(monkeypatch):
    # in-process moto: requests must not go to an endpoint another fixture exported
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(name, value)
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        client.upload_file(str(CONVERSATION), BUCKET, KEY)
        yield client


def sweep_input(**extra):
    return {
        "trace": {"bucket": BUCKET, "key": KEY, "format": "mooncake"},
        "capacities": [5000, 20000],
        "policies": ["lru", "lfu"],
        "output": {"bucket": BUCKET, "prefix": "reports/run-1/"},
        **extra,
    }


def test_run_and_report_tasks_equal_the_local_replay(s3):
    records = list(read_trace(CONVERSATION, "mooncake"))
    settings = SweepSettings(block_size=512)
    sweep = sweep_input(settings={"seed": 3})
    grid = [("lru", 5000), ("lru", 20000), ("lfu", 5000)]
    results = []
    for policy, capacity in grid:
        event = json.loads(json.dumps({"policy": policy, "capacity": capacity, "instance": None, "sweep": sweep}))
        result = run_task(event, s3)
        json.dumps(result)  # JSON-able, as Step Functions needs
        expected = replay(records, settings.replay_config(policy, capacity)).totals
        for name, value in expected.to_dict().items():
            assert result[name] == value, name
        assert result["duration_s"] == pytest.approx(3536.999)
        body = s3.get_object(Bucket=BUCKET, Key=result["timeseries_key"])["Body"].read().decode()
        assert result["timeseries_key"] == f"reports/run-1/timeseries/{policy}-{capacity}.csv"
        assert body.startswith("instance,window_start_s") and len(body.splitlines()) == 60
        results.append(result)
    # the Map of Maps nests its results: the report task flattens them
    summary = report_task(
        {
            **sweep,
            "target_hit_ratio": 0.25,
            "plan": {"model": "llama-3.1-70b", "tier": "ssd"},
            "results": [[[results[0]], [results[1]]], [[results[2]]]],
        },
        s3,
    )
    assert summary["report_key"] == "reports/run-1/report.json"
    assert summary["points"] == 3
    assert summary["recommendation"]["policy"] == "lru"
    assert summary["recommendation"]["capacity"] == 20000
    assert summary["smallest_capacity"]["lfu"]["capacity"] is None
    report = json.loads(s3.get_object(Bucket=BUCKET, Key=summary["report_key"])["Body"].read())
    # report.json rounds floats for people: 4 significant digits
    assert report["policies"]["lru"]["block_hit_ratio"] == pytest.approx(
        [results[0]["block_hit_ratio"], results[1]["block_hit_ratio"]], rel=5e-4
    )
    assert report["policies"]["lru"]["block_hit_ratio"][1] == 0.2878
    assert report["recommendation"]["gpus"] > 0
    # the plan: GiB of a 70B model's 160 MiB blocks, and the quota with the watermark
    assert report["plan"]["block_bytes"] == 512 * 320 * 1024
    assert report["recommendation"]["capacity_gib"] == 20000 * 160 / 1024
    assert report["quota"]["max_key_count"] == 22223  # 20000 / 0.9
    with pytest.raises(ConfigError, match="plan"):
        report_task({**sweep, "plan": {"colour": "red"}, "results": results}, s3)
    assert set(summary["plots"]) == {"reports/run-1/hit_ratio_vs_capacity.png", "reports/run-1/hit_rate_over_time.png"}
    for key in summary["plots"]:
        head = s3.get_object(Bucket=BUCKET, Key=key)
        assert head["ContentType"] == "image/png" and head["Body"].read(4) == b"\x89PNG"


def test_tasks_reject_incomplete_events(s3):
    with pytest.raises(ConfigError):
        run_task({"policy": "lru", "capacity": 10, "sweep": {"trace": {"bucket": BUCKET}}}, s3)
    with pytest.raises(ConfigError):
        report_task({"output": {"bucket": BUCKET}, "results": []}, s3)
