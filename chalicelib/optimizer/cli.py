"""Command line: ``python -m chalicelib.optimizer replay|mrc|sweep|report|tune|tiers ...``."""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from chalicelib.optimizer.cost import CostModel
from chalicelib.optimizer.errors import ConfigError, OptimizerError
from chalicelib.optimizer.kvcm_policy import ORDERS, KVCMPolicy
from chalicelib.optimizer.mrc import SHARDS_GRID_POINTS, lru_curve, shards_error
from chalicelib.optimizer.planner import (
    DEFAULT_MODEL,
    DEFAULT_TIER,
    MODEL_PRESETS,
    STORAGE_TIERS,
    CapacityPlan,
    build_plan,
    for_people,
    parse_prices,
)
from chalicelib.optimizer.policies import POLICIES, policy_name
from chalicelib.optimizer.replay import EvictionMode, replay
from chalicelib.optimizer.report import build_report, log_capacities, shards_grid, summary_lines, write_report
from chalicelib.optimizer.shards import DEFAULT_S_MAX
from chalicelib.optimizer.sweep import (
    PointResult,
    SweepSettings,
    TraceSpec,
    aggregate,
    curve_is_exact,
    refine_capacity,
    sweep,
)
from chalicelib.optimizer.synthetic import Workload, generate, workload_summary
from chalicelib.optimizer.tiered import (
    Strategy,
    TieredConfig,
    TierSpec,
    equal_cost_capacity,
    parse_size,
    tier_costs,
    tier_storage,
    tiered_replay,
)
from chalicelib.optimizer.traces import FORMATS, Record, read_trace
from chalicelib.optimizer.tuning import instance_curves, recommend

_SUFFIXES = {"k": 1_000, "m": 1_000_000, "g": 1_000_000_000}
SYNTHETIC_TRACE = "synthetic_trace.jsonl"
DEFAULT_SYNTHETIC_BLOCK = 16  # tokens per block of a synthetic workload (vLLM's default)

DESCRIPTION = """\
KVCM optimizer: replay KV-cache traces to answer "how much cache does this workload
need, and what does it save?".

Capacities are in blocks (one block = --block-size tokens of one instance). Trace
formats: {formats} (or auto to sniff). Policies: {policies}.
""".format(formats=", ".join(FORMATS), policies=", ".join(POLICIES))

EPILOG = """\
examples:
  # exact LRU hit ratio at several capacities, in one pass over the trace
  python -m chalicelib.optimizer mrc --trace traces/mooncake_conversation.jsonl \\
      --format mooncake --capacities 1000,5000,20k --json

  # one replay with time series (hit rate per 60 s window, per instance)
  python -m chalicelib.optimizer replay --trace traces/kvcm_event_publisher.log \\
      --capacity 2000 --policy leaf_aware_lru --timeseries out/ts.csv

  # a sweep of policies x capacities on all CPUs
  python -m chalicelib.optimizer sweep --trace trace.jsonl --capacities log:1000:100k:10 \\
      --policies lru,random_lru,lfu --json

  # the full capacity report: report.json, hit-ratio and hit-rate-over-time PNGs
  python -m chalicelib.optimizer report --trace traces/mooncake_conversation.jsonl \\
      --format mooncake --out out/optimizer-demo --model-params 70e9 --gpu-price 2.5

capacity lists: "1000,5000", "20k,1M", or "log:LOW:HIGH:COUNT" for COUNT log-spaced values.
"""

#: The public traces shipped in the repository (traces/README.md), from its root.
TRACES = "traces"
EXAMPLES = {
    "replay": f"""example:
  python -m chalicelib.optimizer replay --trace {TRACES}/kvcm_event_publisher.log \\
      --capacity 2000 --policy leaf_aware_lru --timeseries out/ts.csv""",
    "mrc": f"""example:
  python -m chalicelib.optimizer mrc --trace {TRACES}/mooncake_conversation.jsonl \\
      --format mooncake --capacities 1000,5000 --json
  {{"hit_ratio": {{"1000": 0.0445..., "5000": 0.1118...}}}}""",
    "sweep": f"""example:
  python -m chalicelib.optimizer sweep --trace {TRACES}/mooncake_conversation.jsonl \\
      --capacities log:1k:100k:8 --policies lru,random_lru,lfu --workers 2""",
    "tune": f"""example:
  python -m chalicelib.optimizer tune --trace {TRACES}/kvcm_event_publisher.log \\
      --group-quota 4000 --max-shift 0.2""",
    "tiers": f"""example:
  python -m chalicelib.optimizer tiers --trace {TRACES}/mooncake_conversation.jsonl \\
      --tier mem:300GiB:lru --tier s3:20TiB:lru --strategy demote --compare""",
    "report": f"""examples:
  python -m chalicelib.optimizer report --trace {TRACES}/mooncake_conversation.jsonl \\
      --format mooncake --out out/optimizer-demo --model llama-3.1-70b --storage-tier ssd

  # ROI before going online: a synthetic workload of a model not served yet
  python -m chalicelib.optimizer report --out out/roi --model qwen2.5-32b \\
      --workload rate=5,duration=3600,prompt=lognormal:1500:1,system=2048,followup=0.6,think=90""",
}


def parse_capacity(text: str) -> int:
    """``20000``, ``20k``, ``1.5M`` -> blocks."""
    value = text.strip().lower().replace("_", "")
    scale = _SUFFIXES.get(value[-1:], 1)
    number = value[:-1] if scale != 1 else value
    try:
        blocks = float(number) * scale
    except ValueError:
        raise ConfigError(f"not a capacity: {text!r}") from None
    if blocks < 0 or blocks != int(blocks):
        raise ConfigError(f"capacity must be a whole number of blocks >= 0: {text!r}")
    return int(blocks)


def parse_capacities(text: str) -> list[int]:
    """A comma list of capacities, or ``log:LOW:HIGH:COUNT``."""
    if text.strip().lower().startswith("log:"):
        parts = text.split(":")
        if len(parts) != 4:
            raise ConfigError(f"expected log:LOW:HIGH:COUNT, got {text!r}")
        return log_capacities(parse_capacity(parts[1]), parse_capacity(parts[2]), int(parse_capacity(parts[3])))
    caps = [parse_capacity(part) for part in text.split(",") if part.strip()]
    if not caps:
        raise ConfigError("no capacities given")
    return caps


def _policies(text: str | None, settings: SweepSettings) -> list[str]:
    """The policies asked for; by default every policy the eviction mode can run."""
    if text is None:
        return [
            name for name, cls in POLICIES.items() if settings.mode is EvictionMode.INSTANCE_PRECISE or not cls.timed
        ]
    return [p for p in (part.strip() for part in text.split(",")) if p]


def _trace_args(parser: argparse.ArgumentParser, synthetic: bool = False) -> None:
    group = parser.add_argument_group("trace")
    group.add_argument(
        "--trace",
        required=not synthetic,
        metavar="FILE",
        help="trace file (JSONL)" + (", or --workload" if synthetic else ""),
    )
    if synthetic:
        group.add_argument(
            "--workload",
            metavar="SPEC",
            help="instead of a trace, a synthetic workload of a model not served "
            "yet, e.g. 'rate=2,duration=3600,prompt=lognormal:1500:1,"
            "output=fixed:300,system=1024,system_prompts=4,followup=0.5,"
            "think=60' (any subset; see docs/optimizer.md); its trace is "
            "written to the output directory",
        )
    group.add_argument(
        "--format",
        default="auto",
        choices=["auto", *FORMATS],
        help="trace format (default: auto = sniff the first line)",
    )
    group.add_argument(
        "--instance", metavar="NAME", help="instance name for single-instance formats (mooncake, qwen_bailian)"
    )
    group.add_argument(
        "--block-size",
        type=int,
        metavar="TOKENS",
        help="tokens per block (default: the format's, e.g. 512 for mooncake); "
        "token hit ratios and keys derived from tokens use it",
    )


def _replay_args(parser: argparse.ArgumentParser, modes: bool = True) -> None:
    """The replay's options; without ``modes`` no --mode/--batch-size (instance_precise)."""
    group = parser.add_argument_group("replay")
    if modes:
        group.add_argument(
            "--mode",
            default="instance_precise",
            choices=[m.value for m in EvictionMode],
            help="instance_precise: own capacity per instance, enforced after every "
            "block; instance_rough: own capacity, evicted in batches after each "
            "write; group_rough: one capacity shared by all instances "
            "(default: instance_precise)",
        )
        group.add_argument(
            "--batch-size", type=int, default=64, help="blocks per eviction batch in the rough modes (default 64)"
        )
    else:
        parser.set_defaults(mode=EvictionMode.INSTANCE_PRECISE.value, batch_size=64)
    group.add_argument("--seed", type=int, default=0, help="seed of random_lru (default 0)")
    group.add_argument(
        "--samples", type=int, default=5, help="blocks random_lru samples per eviction (default 5, as Redis)"
    )
    group.add_argument(
        "--window", type=float, default=60.0, metavar="SECONDS", help="time-series window (default 60 s)"
    )
    group.add_argument(
        "--no-read-refresh",
        action="store_true",
        help="reads do not refresh recency (upstream KVCM's behaviour; KVCM refreshes by default)",
    )
    kvcm = parser.add_argument_group("KVCM's reclaimer (the kvcm policy, and the quota a report recommends)")
    kvcm.add_argument(
        "--used-percentage", type=float, default=0.9, help="trigger_strategy.used_percentage (default 0.9)"
    )
    kvcm.add_argument("--reclaim-step-percentage", type=int, default=10, help="reclaim_step_percentage (default 10)")
    kvcm.add_argument(
        "--reclaim-policy", default="lru", choices=ORDERS, help="reclaim_policy: lru, lfu or ttl (default lru)"
    )
    kvcm.add_argument(
        "--ttl", type=int, default=0, metavar="SECONDS", help="ttl_seconds of the ttl policy (default 0: never expires)"
    )
    kvcm.add_argument(
        "--trigger-period", type=int, default=10, metavar="SECONDS", help="trigger_period_seconds (default 10)"
    )
    kvcm.add_argument(
        "--reclaim-round",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how often reclaim rounds run: 60 on AWS (the schedule), 1 on the local stack (default 60)",
    )


def _settings(args: argparse.Namespace, block_size: int) -> SweepSettings:
    kvcm = {
        "order": args.reclaim_policy,
        "ttl_s": args.ttl,
        "used_percentage": args.used_percentage,
        "step_percentage": args.reclaim_step_percentage,
        "period_s": args.trigger_period,
        "round_s": args.reclaim_round,
    }
    return SweepSettings(
        mode=args.mode,
        batch_size=args.batch_size,
        block_size=block_size,
        window_s=args.window,
        seed=args.seed,
        read_refresh=not args.no_read_refresh,
        policy_params={"random_lru": {"samples": args.samples}, "kvcm": kvcm},
    )


def _spec(args: argparse.Namespace) -> TraceSpec:
    return TraceSpec(args.trace, args.format, args.instance, args.block_size).resolved()


def _print_json(data: Any, indent: int | None = 2) -> None:
    json.dump(data, sys.stdout, indent=indent)
    sys.stdout.write("\n")


def cmd_replay(args: argparse.Namespace) -> int:
    spec = _spec(args)
    settings = _settings(args, spec.block_size or 16)
    config = settings.replay_config(args.policy, parse_capacity(args.capacity))
    result = replay(spec.records(), config)
    if args.timeseries:
        with open(args.timeseries, "w", newline="", encoding="utf-8") as handle:
            result.write_timeseries_csv(handle)
    if args.json:
        _print_json(result.to_dict())
        return 0
    t = result.totals
    print(
        f"{config.policy} at {config.capacity:,} blocks ({config.mode.value}), "
        f"{len(result.instances)} instance(s), {result.duration_s:,.0f} s of trace"
    )
    print(
        f"  block hit ratio     {_pct(t.block_hit_ratio)}  "
        f"(external {_pct(t.external_block_hit_ratio)}, {t.read_blocks:,} blocks read)"
    )
    print(f"  token hit ratio     {_pct(t.token_hit_ratio)}")
    print(
        f"  replay              {result.elapsed_s:.3f} s, "
        f"{result.block_accesses / max(result.elapsed_s, 1e-9):,.0f} block accesses/s"
    )
    if args.timeseries:
        print(f"  time series         {args.timeseries}")
    return 0


def _pct(value: float | None) -> str:
    return "   n/a" if value is None else f"{value:7.2%}"


def _stream(spec: TraceSpec) -> Iterator[Record]:
    """The trace's records, one at a time (a sampled curve holds no more than its sample)."""
    return read_trace(spec.path, spec.format, instance=spec.instance, block_size=spec.block_size)


def cmd_mrc(args: argparse.Namespace) -> int:
    spec = _spec(args)
    caps = parse_capacities(args.capacities)
    block_size = spec.block_size or 16
    if args.exact or args.tokens:  # token hits need every block: only the exact curve has them
        curve = lru_curve(_stream(spec), block_size=block_size)
        kind = "exact"
    elif args.sample_rate is not None:
        curve = lru_curve(_stream(spec), block_size=block_size, sample_rate=args.sample_rate)
        kind = f"SHARDS estimate at a fixed rate {args.sample_rate:g}"
    else:
        curve = lru_curve(_stream(spec), block_size=block_size, s_max=args.s_max)
        kind = f"fixed-size SHARDS estimate, s_max {args.s_max:,}, final rate {curve.sample_rate:.4g}"
    if args.json:
        data: dict[str, Any] = {"hit_ratio": {str(c): curve.block_hit_ratio(c) for c in caps}}
        if args.tokens:
            data["token_hit_ratio"] = {str(c): curve.token_hit_ratio(c) for c in caps}
        _print_json(data, indent=None)
        return 0
    print(f"prefix-aware LRU hit ratio ({kind}; one pass, {curve.elapsed_s:.3f} s)")
    print(f"{'capacity':>12}  {'block hit':>9}  {'token hit':>9}")
    for c in caps:
        print(f"{c:>12,}  {_pct(curve.block_hit_ratio(c)):>9}  {_pct(curve.token_hit_ratio(c)):>9}")
    print(f"saturates at {curve.saturation_capacity:,} blocks")
    if not curve.exact and (args.check or args.sample_rate is not None):
        exact = lru_curve(_stream(spec), block_size=block_size)
        print("SHARDS error against the exact curve (absolute block hit ratio):")
        # the capacities asked, and a log grid up to saturation: the steep part of the curve
        # is where a sample errs most, and a few capacities can miss it
        grid = shards_grid(exact, SHARDS_GRID_POINTS)
        for name, points in (
            ("at the capacities asked", caps),
            (f"over {len(grid)} log-spaced capacities {grid[0]:,}..{grid[-1]:,}", grid),
        ):
            error = shards_error(exact, curve, points)
            print(
                f"  {name}: mean {error['mean_abs_error']:.4f}, max {error['max_abs_error']:.4f} "
                f"at {error['max_at_capacity']:,} blocks ({error['error_at_max']:+.4f})"
            )
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    spec = _spec(args)
    settings = _settings(args, spec.block_size or 16)
    result = sweep(
        spec,
        parse_capacities(args.capacities),
        _policies(args.policies, settings),
        settings=settings,
        split_instances=args.split_instances,
        workers=args.workers,
        use_curve=not args.no_curve,
    )
    data = result.to_dict()
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2)
    if args.json:
        _print_json(data)
        return 0
    print(f"{len(result.points)} points in {result.elapsed_s:.2f} s")
    print(f"{'policy':<16}{'capacity':>12}{'instance':>14}{'block hit':>11}{'token hit':>11}  method")
    for p in result.points:
        print(
            f"{p.policy:<16}{p.capacity:>12,}{(p.instance or 'all')[:13]:>14}"
            f"{_pct(p.totals.block_hit_ratio):>11}{_pct(p.totals.token_hit_ratio):>11}  {p.method}"
        )
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    workload = None
    if args.workload is not None:
        if args.trace:
            raise ConfigError("give --trace or --workload, not both")
        workload = Workload.parse(args.workload)
        args.trace = str(Path(args.out) / SYNTHETIC_TRACE)
        args.format, args.block_size = "mooncake", args.block_size or DEFAULT_SYNTHETIC_BLOCK
        if generate(workload, args.block_size, args.trace) == 0:
            raise ConfigError("the workload makes no request in its duration")
    elif not args.trace:
        raise ConfigError("give --trace or --workload")
    spec = _spec(args)
    settings = _settings(args, spec.block_size or 16)
    records = spec.records()
    cost, plan = _cost_and_plan(args, settings, len({r.instance for r in records}))
    exact = curve_is_exact(records, settings)
    curve = lru_curve(records, block_size=settings.block_size)
    caps = (
        parse_capacities(args.capacities)
        if args.capacities
        else log_capacities(max(1, curve.saturation_capacity // 500), curve.saturation_capacity, 10)
    )
    policies = _policies(args.policies, settings)
    result = sweep(spec, caps, policies, settings=settings, workers=args.workers)

    def build(points: list[PointResult]) -> dict[str, Any]:
        return build_report(
            trace={
                "name": Path(spec.path).name,
                "path": spec.path,
                "format": spec.format,
                "block_size": spec.block_size,
                **result.summary.to_dict(),
                **({"workload": workload_summary(workload)} if workload else {}),
            },
            settings=settings.to_dict(),
            points=points,
            duration_s=result.summary.duration_s,
            target=args.target,
            cost=cost,
            curve=curve if exact else None,
            plan=plan,
        )

    report = build(result.points)
    if KVCMPolicy.name in policies:
        # the quota to configure comes from the kvcm policy: bisect its grid to 2 %
        table = aggregate(result.points)
        report = build(
            result.points
            + refine_capacity(records, settings, KVCMPolicy.name, table[KVCMPolicy.name], report["target_hit_ratio"])
        )
    rec = report["recommendation"]
    policy, capacity = ("lru", max(caps)) if rec is None else (rec["policy"], rec["capacity"])
    if args.timeseries_capacity:
        policy, capacity = "lru", parse_capacity(args.timeseries_capacity)
    timeseries = replay(records, settings.replay_config(policy, capacity))
    files = write_report(report, args.out, timeseries=timeseries)
    print("\n".join(summary_lines(report)))
    for path in files:
        print(f"  wrote {path}")
    return 0


def _cost_and_plan(args: argparse.Namespace, settings: SweepSettings, instances: int) -> tuple[CostModel, CapacityPlan]:
    """The cost model and the capacity plan the report's options describe."""
    shared = settings.mode is EvictionMode.GROUP_ROUGH
    plan, preset = build_plan(
        block_size=settings.block_size,
        instances=1 if shared else max(1, instances),
        model=args.model,
        kv_dtype=args.kv_dtype,
        kv_bytes_per_token=args.kv_bytes_per_token,
        tier=args.storage_tier,
        prices=parse_prices(args.storage_price),
        used_percentage=args.used_percentage,
        reclaim_step_percentage=args.reclaim_step_percentage,
        currency=args.currency,
    )
    params = args.model_params if args.model_params is not None else preset.params
    cost = CostModel(
        model_params=params,
        flops_per_token=args.flops_per_token,
        gpu_flops=args.gpu_flops,
        mfu=args.mfu,
        gpu_hour_price=args.gpu_price,
        currency=args.currency,
    )
    return cost, plan


def _planner_args(parser: argparse.ArgumentParser, storage_tier: bool = True) -> None:
    """The cost model's options; without ``storage_tier`` no --storage-tier (each tier
    names its own)."""
    cost = parser.add_argument_group("cost model (prefill saved -> GPUs -> money)")
    cost.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        choices=list(MODEL_PRESETS),
        help="model preset: KV bytes per token (layers x KV heads x head dim x "
        f"dtype) and parameters (default {DEFAULT_MODEL})",
    )
    cost.add_argument("--kv-dtype", help="KV cache dtype, overriding the preset's (bf16, fp8, ...)")
    cost.add_argument("--kv-bytes-per-token", type=float, help="KV bytes per token, instead of the preset's")
    cost.add_argument(
        "--model-params",
        type=float,
        help="model parameters; prefill FLOPs per token = 2 x params (default: the preset's)",
    )
    cost.add_argument("--flops-per-token", type=float, help="override FLOPs per prefill token")
    cost.add_argument(
        "--gpu-flops", type=float, default=989e12, help="GPU peak FLOP/s (default 989e12: H100 SXM dense BF16)"
    )
    cost.add_argument("--mfu", type=float, default=0.4, help="model FLOP utilisation in prefill (default 0.4)")
    cost.add_argument("--gpu-price", type=float, default=2.5, help="price per GPU-hour (default 2.5)")
    cost.add_argument("--currency", default="USD", help="label of the prices (default USD)")
    tiers = ", ".join(f"{t.name} {t.gib_hour_price:g}" for t in STORAGE_TIERS.values())
    if storage_tier:
        cost.add_argument(
            "--storage-tier",
            default=DEFAULT_TIER,
            choices=list(STORAGE_TIERS),
            help=f"where the blocks live (default {DEFAULT_TIER}); prices per GiB-hour: {tiers}",
        )
    else:
        parser.set_defaults(storage_tier=DEFAULT_TIER)
    cost.add_argument(
        "--storage-price",
        action="append",
        default=[],
        metavar="TIER=PRICE",
        help=f"replace a tier's price per GiB-hour (repeatable; defaults: {tiers})",
    )


def _quotas(text: str) -> dict[str, int]:
    """``i1=20k,i2=5000`` -> blocks per instance."""
    quotas = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigError(f"expected INSTANCE=BLOCKS, got {item!r}")
        quotas[name.strip()] = parse_capacity(value)
    return quotas


def cmd_tune(args: argparse.Namespace) -> int:
    spec = _spec(args)
    curves = instance_curves(spec.records(), spec.block_size or 16)
    if args.quotas:
        current = _quotas(args.quotas)
    elif args.group_quota:
        total = parse_capacity(args.group_quota)
        current = {name: total // len(curves) for name in curves}
    else:
        raise ConfigError("give the current quotas (--quotas) or the group's (--group-quota)")
    rec = recommend(
        curves, current, used_fraction=args.used_percentage, max_shift=args.max_shift, granules=args.granules
    )
    if args.json:
        _print_json(for_people(rec))
        return 0
    now, step = rec["current"], rec["recommended"]
    print(
        f"group hit ratio {_pct(now['group_hit_ratio'])} now, {_pct(step['group_hit_ratio'])} "
        f"after this step (expected gain {step['expected_gain']:+.2%}); the optimum of "
        f"{rec['total_quota_blocks']:,} blocks gives {_pct(rec['optimum']['group_hit_ratio'])}"
    )
    print(f"{'instance':<24}{'quota now':>12}{'recommended':>13}{'hit now':>10}{'hit then':>10}")
    for name, row in rec["per_instance"].items():
        print(
            f"{name[:23]:<24}{row['current']:>12,}{row['recommended']:>13,}"
            f"{_pct(row['hit_ratio_now']):>10}{_pct(row['hit_ratio_recommended']):>10}"
        )
    return 0


def _tier_specs(text: str, plan: CapacityPlan, settings: SweepSettings) -> list[TierSpec]:
    """``--tier NAME:CAPACITY[,CAPACITY...][:POLICY]``: one spec per capacity, each in
    blocks (``20k``) or bytes (``8GiB``)."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0].strip():
        raise ConfigError(f"--tier: expected NAME:CAPACITY[:POLICY], got {text!r}")
    name = parts[0].strip()
    try:
        blocks = []
        for capacity in filter(None, (part.strip() for part in parts[1].split(","))):
            size = parse_size(capacity)
            blocks.append(parse_capacity(capacity) if size is None else size // plan.block_bytes)
        if not blocks:
            raise ConfigError("no capacity given")
        policy = policy_name(parts[2] if len(parts) == 3 else "lru")
    except ConfigError as exc:
        raise ConfigError(f"--tier {text}: {exc}") from None
    tier_storage(name)  # an unknown tier name fails here, naming it
    return [TierSpec(name, count, policy, settings.policy_params.get(policy, {})) for count in blocks]


def _tier_rows(costs: dict[str, Any]) -> list[str]:
    rows = []
    for t in costs["tiers"]:
        rows.append(
            f"{t['name'][:9]:<10}{t['storage_tier']:<6}{t['policy'][:14]:<15}{t['capacity']:>11,}"
            f"{t['capacity_gib']:>11,.1f}{_pct(t['hit_ratio']):>9}{t['stored_blocks']:>10,}"
            f"{t['demoted_blocks']:>10,}{t['promoted_blocks']:>10,}{t['storage_cost_per_hour']:>10.3f}"
            f"{t['storage_cost_per_month']:>11,.0f}{_money(t['gpu_cost_saved_per_hour']):>10}"
        )
    rows.append(
        f"{'total':<42}{_pct(costs['hit_ratio']):>20}{'':>30}{costs['storage_cost_per_hour']:>10.3f}"
        f"{costs['storage_cost_per_month']:>11,.0f}{_money(costs['gpu_cost_saved_per_hour']):>10}"
        f"   net {_money(costs['net_per_hour']).strip()}/h"
    )
    return rows


def _money(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _tier_grid(runs: list[dict[str, Any]], as_json: bool) -> int:
    """One line per combination of the tiers' capacities."""
    if as_json:
        _print_json(for_people({"grid": runs}))
        return 0
    names = [t["name"] for t in runs[0]["tiers"]]
    print(
        "".join(f"{name[:11]:>12}" for name in names)
        + "  "
        + "".join(f"{'hit ' + n[:7]:>12}" for n in names)
        + f"{'hit':>9}{'store/h':>10}{'GPU/h':>10}{'net/h':>10}"
    )
    for data in runs:
        print(
            "".join(f"{t['capacity']:>12,}" for t in data["tiers"])
            + "  "
            + "".join(f"{_pct(t['hit_ratio']):>12}" for t in data["tiers"])
            + f"{_pct(data['hit_ratio']):>9}{data['storage_cost_per_hour']:>10.3f}"
            + f"{_money(data['gpu_cost_saved_per_hour']):>10}{_money(data['net_per_hour']):>10}"
        )
    return 0


def cmd_tiers(args: argparse.Namespace) -> int:
    spec = _spec(args)
    settings = _settings(args, spec.block_size or 16)
    records = spec.records()
    cost, plan = _cost_and_plan(args, settings, 1)
    prices = parse_prices(args.storage_price)
    choices = [_tier_specs(text, plan, settings) for text in args.tier]

    def run(chosen: tuple[TierSpec, ...]) -> dict[str, Any]:
        config = TieredConfig(
            chosen,
            Strategy.parse(args.strategy),
            promote=not args.no_promote,
            block_size=settings.block_size,
            window_s=settings.window_s,
            seed=settings.seed,
            read_refresh=settings.read_refresh,
        )
        result = tiered_replay(records, config)
        return {"config": config.to_dict(), **tier_costs(result, plan, cost, prices), "replay": result.to_dict()}

    if any(len(options) > 1 for options in choices):
        if args.compare:
            raise ConfigError("--compare: give one capacity per tier")
        return _tier_grid([run(tuple(tiers)) for tiers in itertools.product(*choices)], args.json)
    tiers = tuple(options[0] for options in choices)
    data = run(tiers)
    if args.compare:
        first = tiers[0]
        alone = TierSpec(
            first.name, equal_cost_capacity(tiers, plan, first.name, prices), first.policy, first.policy_params
        )
        data["equal_cost_single_tier"] = run((alone,))
    if args.json:
        _print_json(for_people(data))
        return 0
    strategy = Strategy.parse(args.strategy).value
    print(
        f"{strategy}, {'promote on hit' if not args.no_promote else 'no promotion'}: "
        f"{len(data['replay']['instances'])} instance(s), {data['replay']['totals']['read_blocks']:,} blocks read, "
        f"{data['replay']['duration_s']:,.0f} s of trace; {plan.assumptions()[1]}"
    )
    header = (
        f"{'tier':<10}{'kind':<6}{'policy':<15}{'blocks':>11}{'GiB':>11}{'hit':>9}{'stored':>10}"
        f"{'demoted':>10}{'promoted':>10}{'store/h':>10}{'store/mo':>11}{'GPU/h':>10}"
    )
    print(header)
    print("\n".join(_tier_rows(data)))
    if args.compare:
        alone_costs = data["equal_cost_single_tier"]
        print(f"the same storage cost in {tiers[0].name} alone:")
        print("\n".join(_tier_rows(alone_costs)[:1]))
        print(
            f"  hit ratio {_pct(alone_costs['hit_ratio']).strip()} alone against "
            f"{_pct(data['hit_ratio']).strip()} tiered; net {_money(alone_costs['net_per_hour'])}/h "
            f"against {_money(data['net_per_hour'])}/h ({plan.currency})"
        )
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree of the commands."""
    parser = argparse.ArgumentParser(
        prog="python -m chalicelib.optimizer",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = commands.add_parser(
        "replay",
        help="replay a trace at one capacity with one policy",
        description="Replay a trace through one policy at one capacity and "
        "print hit ratios (optionally a per-window CSV).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EXAMPLES["replay"],
    )
    _trace_args(p)
    _replay_args(p)
    p.add_argument("--capacity", required=True, help="blocks per instance (or per group), e.g. 20k")
    p.add_argument("--policy", default="lru", choices=list(POLICIES), help="eviction policy (default: lru)")
    p.add_argument("--timeseries", metavar="CSV", help="write hit rates per window and instance")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handler=cmd_replay)

    p = commands.add_parser(
        "mrc",
        help="LRU hit ratio at many capacities in one pass (sampled or exact)",
        description="Prefix-aware LRU hit-ratio curve from stack distances (one pass, every "
        "capacity at once): by default a fixed-size SHARDS estimate in bounded memory, exact "
        "up to the top of the stack; --exact for the exact curve, which is the cheaper one in "
        "time on every trace and in memory on traces of up to ~3xS_MAX distinct blocks per "
        "instance (sampling hashes every block; the exact curve keeps every distinct block). "
        "Reads do not refresh recency in this model; for request traces (mooncake, "
        "qwen_bailian) that changes nothing.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EXAMPLES["mrc"],
    )
    _trace_args(p)
    p.add_argument("--capacities", required=True, help='e.g. "1000,5000" or "log:1k:1M:20"')
    sampling = p.add_mutually_exclusive_group()
    sampling.add_argument(
        "--s-max",
        type=int,
        default=DEFAULT_S_MAX,
        help=f"fixed-size SHARDS (the default): at most S_MAX sampled keys, the exact top of "
        f"each instance's stack S_MAX..2xS_MAX keys (default {DEFAULT_S_MAX:,}); within 0.01 of the "
        "exact curve on generated traces of 10k-10M distinct blocks, in O(S_MAX) memory",
    )
    sampling.add_argument(
        "--sample-rate",
        type=float,
        help="SHARDS at a fixed rate instead (memory grows with the trace); prints its error against the exact curve",
    )
    sampling.add_argument(
        "--exact",
        action="store_true",
        help="the exact curve: cheaper than sampling in time on any trace (no hashing, about "
        "one replay) and in memory too while the trace has fewer than ~3xS_MAX distinct blocks "
        "per instance; it keeps ~300 bytes per distinct block (3 GB at 10M), sampling O(S_MAX)",
    )
    p.add_argument(
        "--check", action="store_true", help="with a sampled curve, also build the exact one and print the error"
    )
    p.add_argument("--json", action="store_true", help='print {"hit_ratio": {"<capacity>": ratio, ...}}')
    p.add_argument("--tokens", action="store_true", help="with --json, add token_hit_ratio (the exact curve)")
    p.set_defaults(handler=cmd_mrc)

    all_policies = ",".join(POLICIES)
    p = commands.add_parser(
        "sweep",
        help="replay policies x capacities in parallel",
        description="Replay every (policy, capacity) point on all CPUs; "
        "LRU points come from the exact one-pass curve when it "
        "applies.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EXAMPLES["sweep"],
    )
    _trace_args(p)
    _replay_args(p)
    p.add_argument("--capacities", required=True, help='e.g. "1000,5000" or "log:1k:1M:20"')
    p.add_argument("--policies", help=f"comma-separated policies (default: every one the mode runs: {all_policies})")
    p.add_argument("--split-instances", action="store_true", help="one point per instance too (instance modes only)")
    p.add_argument("--workers", type=int, help="processes (default: one per CPU)")
    p.add_argument("--no-curve", action="store_true", help="replay LRU points one by one")
    p.add_argument("--out", metavar="JSON", help="also write the results to this file")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(handler=cmd_sweep)

    p = commands.add_parser(
        "report",
        help="capacity report: JSON + PNG plots + savings",
        description="Sweep, find the smallest capacity reaching a target hit "
        "ratio, price the prefill it saves and plot it all.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EXAMPLES["report"],
    )
    _trace_args(p, synthetic=True)
    _replay_args(p)
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--capacities", help="grid (default: 10 log-spaced up to where LRU saturates)")
    p.add_argument("--policies", help=f"comma-separated policies (default: every one the mode runs: {all_policies})")
    p.add_argument("--target", type=float, help="target block hit ratio (default: 90%% of the best one reached)")
    p.add_argument(
        "--timeseries-capacity", help="LRU capacity of the hit-rate-over-time plot (default: the recommended)"
    )
    p.add_argument("--workers", type=int, help="processes (default: one per CPU)")
    _planner_args(p)
    p.set_defaults(handler=cmd_report)

    p = commands.add_parser(
        "tune",
        help="split a group's quota among its instances",
        description="Per-instance hit-ratio curves from a trace (e.g. "
        "KVCM's event log), the split of the group's quota "
        "that maximises the group's hit ratio (cliffs "
        "included), and a bounded step toward it.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EXAMPLES["tune"],
    )
    _trace_args(p)
    p.add_argument("--quotas", help="current quotas per instance, e.g. i1=20k,i2=5000")
    p.add_argument("--group-quota", help="the group's quota in blocks, split evenly now")
    p.add_argument(
        "--used-percentage",
        type=float,
        default=0.9,
        help="KVCM's watermark: a quota keeps this share cached (default 0.9)",
    )
    p.add_argument(
        "--max-shift", type=float, default=0.2, help="share of the group quota one step may move (default 0.2)"
    )
    p.add_argument("--granules", type=int, default=200, help="quota granules of the split's grid (default 200)")
    p.add_argument("--json", action="store_true", help="print the recommendation as JSON")
    p.set_defaults(handler=cmd_tune)

    p = commands.add_parser(
        "tiers",
        help="replay tiers (fastest first): hit ratio and cost per tier",
        description="Replay a trace through several tiers per instance, each with its "
        "capacity and policy: write_through stores every write in every tier, demote "
        "(upstream's cascading) writes tier 0 and moves each tier's victims to the next. A hit "
        "is credited to the fastest tier holding the block (and copied up, unless "
        "--no-promote); a block leaves only when no tier holds it. Prints per tier the hit "
        "ratio, the blocks stored, demoted and promoted, the storage cost and the GPU time "
        "its hits save.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EXAMPLES["tiers"],
    )
    _trace_args(p)
    _replay_args(p, modes=False)
    p.add_argument(
        "--tier",
        action="append",
        required=True,
        metavar="NAME:CAPACITY[:POLICY]",
        help="a tier, fastest first (repeat for each): NAME a storage tier (mem/dram, ssd, nfs, "
        "s3) that prices it; CAPACITY per instance in blocks (20k) or bytes (8GiB), or a comma "
        "list of them: one replay per combination of the tiers' capacities, a line each; "
        "POLICY default lru",
    )
    p.add_argument("--strategy", default="demote", choices=[s.value for s in Strategy], help="default demote")
    p.add_argument("--no-promote", action="store_true", help="a hit in a slower tier is not copied up")
    p.add_argument("--compare", action="store_true", help="also replay the first tier alone at the same storage cost")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    _planner_args(p, storage_tier=False)
    p.set_defaults(handler=cmd_tiers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (2 for bad input, with the reason on stderr)."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except OptimizerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
