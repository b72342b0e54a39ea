"""Lambda task logic of the optimizer sweep state machine (workflows/optimizer_sweep.asl.json).

Plain functions with an injected boto3 S3 client: ``app.py`` wraps them as the
``optimizer_run`` and ``optimizer_report`` lambda functions.

Sweep input (the state machine's input; ``report_task`` receives it back with ``results``)::

    {
      "trace": {"bucket": "b", "key": "traces/t.jsonl", "format": "mooncake",
                "block_size": 512, "instance": null},          # block_size/instance optional
      "capacities": [1000, 5000, 20000],
      "policies": ["lru", "random_lru"],
      "instances": [null],            # optional: instance ids to replay one by one
      "settings": {"mode": "instance_precise", "batch_size": 64, "seed": 0,
                   "window_s": 60, "read_refresh": true, "policy_params": {}},  # optional
      "output": {"bucket": "b", "prefix": "reports/run-1"},
      "target_hit_ratio": 0.3,        # optional (default: 90% of the best)
      "cost": {"model_params": 8e9, "gpu_flops": 989e12, "mfu": 0.4,
               "gpu_hour_price": 2.5},  # optional, see cost.CostModel
      "plan": {"model": "llama-3.1-70b", "tier": "ssd", "prices": {"ssd": 0.0004},
               "used_percentage": 0.9}  # optional, see planner.build_plan: GiB, storage
                                        # cost, net and the KVCM quota in the report
    }

``run_task`` gets one grid point: ``{"policy", "capacity", "instance", "sweep": <input>}``.
"""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from chalicelib.optimizer.cost import CostModel
from chalicelib.optimizer.errors import ConfigError
from chalicelib.optimizer.planner import build_plan
from chalicelib.optimizer.replay import read_timeseries_csv, replay
from chalicelib.optimizer.report import (
    CAPACITY_PNG,
    REPORT_JSON,
    TIMESERIES_PNG,
    build_report,
    flatten_results,
    write_report,
)
from chalicelib.optimizer.sweep import PointResult, SweepSettings, TraceSpec, TraceSummary

_CONTENT_TYPES = {".json": "application/json", ".png": "image/png", ".csv": "text/csv"}


def _require(mapping: Mapping[str, Any], name: str, where: str) -> Any:
    if not isinstance(mapping, Mapping) or mapping.get(name) in (None, ""):
        raise ConfigError(f"{where} needs {name!r}")
    return mapping[name]


def _prefix(sweep: Mapping[str, Any]) -> tuple[str, str] | None:
    output = sweep.get("output")
    if not output:
        return None
    return _require(output, "bucket", "output"), str(output.get("prefix", "")).strip("/")


def _key(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


def _settings(sweep: Mapping[str, Any], block_size: int) -> SweepSettings:
    return replace(SweepSettings.from_dict(sweep.get("settings") or {}), block_size=block_size)


def _point_name(policy: str, capacity: int, instance: str | None) -> str:
    suffix = f"-{instance}" if instance else ""
    return f"timeseries/{policy}-{capacity}{suffix}.csv"


def run_task(event: dict[str, Any], s3_client: Any) -> dict[str, Any]:
    """Replay one grid point of a sweep on a trace stored in S3.

    Downloads ``sweep.trace`` into a temporary file, replays ``policy`` at ``capacity``
    (restricted to ``instance`` when given), uploads the point's time-series CSV under
    ``sweep.output.prefix`` when an output is given, and returns the point's totals.
    """
    sweep = _require(event, "sweep", "run_task event")
    trace = _require(sweep, "trace", "sweep")
    bucket, key = _require(trace, "bucket", "trace"), _require(trace, "key", "trace")
    policy = str(_require(event, "policy", "run_task event"))
    capacity = int(_require(event, "capacity", "run_task event"))
    instance = event.get("instance")
    with tempfile.TemporaryDirectory(prefix="kvcm-optimizer-") as tmp:
        path = os.path.join(tmp, Path(key).name or "trace")
        s3_client.download_file(bucket, key, path)
        spec = TraceSpec(path, trace.get("format", "auto"), trace.get("instance"), trace.get("block_size")).resolved()
        records = spec.records()
    summary = TraceSummary.of(records)
    if instance is not None:
        records = [r for r in records if r.instance == instance]
    settings = _settings(sweep, spec.block_size or 16)
    result = replay(records, settings.replay_config(policy, capacity))
    point = PointResult(result.config.policy, capacity, instance, result.totals, "replay", result.elapsed_s)
    response = {
        **point.to_dict(),
        "duration_s": summary.duration_s,
        "trace_format": spec.format,
        "block_size": spec.block_size,
        "instances": len(summary.instances),
        "timeseries_key": None,
    }
    target = _prefix(sweep)
    if target is not None:
        out = io.StringIO()
        result.write_timeseries_csv(out)
        csv_key = _key(target[1], _point_name(point.policy, capacity, instance))
        s3_client.put_object(Bucket=target[0], Key=csv_key, Body=out.getvalue().encode(), ContentType="text/csv")
        response["timeseries_key"] = csv_key
    return response


def report_task(event: dict[str, Any], s3_client: Any) -> dict[str, Any]:
    """Combine the Map results of a sweep into a report.

    Writes ``report.json`` and the PNG plots under ``output.prefix`` (the time-series plot
    uses the CSV that ``run_task`` stored for the recommended point) and returns a summary:
    the report's key, the plots' keys, the recommendation and the smallest capacities.
    """
    bucket, prefix = _prefix(event) or (None, "")
    if bucket is None:
        raise ConfigError("report_task needs output.bucket")
    results = flatten_results(_require(event, "results", "report_task event"))
    if not results:
        raise ConfigError("report_task got no grid-point results")
    points = [PointResult.from_dict(r) for r in results]
    trace = event.get("trace") or {}
    block_size = int(results[0].get("block_size") or 16)
    settings = _settings(event, block_size)
    instances = max(int(r.get("instances") or 0) for r in results)
    plan = None
    if event.get("plan"):
        try:
            plan, _ = build_plan(block_size=block_size, instances=max(1, instances), **event["plan"])
        except TypeError as exc:  # an unknown or missing field of "plan"
            raise ConfigError(f"plan: {exc}") from None
    report = build_report(
        trace={
            "name": Path(str(trace.get("key", "trace"))).name,
            "bucket": trace.get("bucket"),
            "key": trace.get("key"),
            "format": results[0].get("trace_format"),
            "instances": instances,
        },
        settings=settings.to_dict(),
        points=points,
        duration_s=max(float(r.get("duration_s") or 0.0) for r in results),
        target=event.get("target_hit_ratio"),
        cost=CostModel(**(event.get("cost") or {})),
        plan=plan,
    )
    timeseries = None
    rec = report["recommendation"]
    chosen = next(
        (
            r
            for r in results
            if rec
            and r["policy"] == rec["policy"]
            and int(r["capacity"]) == rec["capacity"]
            and r.get("timeseries_key")
        ),
        None,
    )
    if chosen is not None:
        body = s3_client.get_object(Bucket=bucket, Key=chosen["timeseries_key"])["Body"].read()
        config = settings.replay_config(chosen["policy"], int(chosen["capacity"]))
        timeseries = read_timeseries_csv(io.StringIO(body.decode()), config)
    uploaded: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="kvcm-report-") as tmp:
        for path in write_report(report, tmp, timeseries=timeseries):
            key = _key(prefix, path.name)
            s3_client.upload_file(str(path), bucket, key, ExtraArgs={"ContentType": _CONTENT_TYPES[path.suffix]})
            uploaded[path.name] = key
    return {
        "report_key": uploaded[REPORT_JSON],
        "plots": [uploaded[name] for name in (CAPACITY_PNG, TIMESERIES_PNG) if name in uploaded],
        "points": len(points),
        "target_hit_ratio": report["target_hit_ratio"],
        "recommendation": rec,
        "smallest_capacity": report["smallest_capacity"],
    }
