"""Capacity reports: JSON plus PNG plots.

A report answers "how much cache does this workload need, and what does it save?":

* hit ratio versus capacity per policy (exact for LRU when the one-pass curve applies,
  replayed grid points otherwise),
* the smallest capacity reaching a target hit ratio, per policy,
* the prefill compute, GPUs and money the hits save (see :mod:`cost`),
* hit rate over time per instance at the recommended capacity.
"""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from chalicelib.optimizer.cost import CostModel
from chalicelib.optimizer.kvcm_policy import KVCMPolicy
from chalicelib.optimizer.mrc import SHARDS_GRID_POINTS, HitRatioCurve
from chalicelib.optimizer.planner import CapacityPlan, for_people
from chalicelib.optimizer.policies import POLICIES
from chalicelib.optimizer.replay import ReplayResult, Totals
from chalicelib.optimizer.sweep import PointResult, aggregate

REPORT_JSON = "report.json"
TIMESERIES_CSV = "timeseries.csv"
CAPACITY_PNG = "hit_ratio_vs_capacity.png"
TIMESERIES_PNG = "hit_rate_over_time.png"


def log_capacities(low: int, high: int, count: int) -> list[int]:
    """About ``count`` distinct integer capacities spaced evenly on a log scale."""
    low, high = max(1, low), max(1, high)
    if count < 2 or low >= high:
        return [low]
    step = (math.log(high) - math.log(low)) / (count - 1)
    return sorted({int(round(math.exp(math.log(low) + i * step))) for i in range(count)})


def shards_grid(exact: HitRatioCurve, points: int = SHARDS_GRID_POINTS) -> list[int]:
    """The capacities a sample's error is measured at: ``points`` log-spaced from 1/2000 of
    the exact curve's saturation up to it (the steep part of a curve, where a sample errs
    most, falls between a few hand-picked capacities)."""
    top = max(2, exact.saturation_capacity)
    return log_capacities(max(1, top // 2000), top, points)


def smallest_capacities(
    table: Mapping[str, Mapping[int, Totals]], target: float, curve: HitRatioCurve | None
) -> dict[str, dict[str, Any]]:
    """Per policy, the smallest capacity whose block hit ratio reaches ``target``: exact
    (any integer) from the LRU curve, else the smallest grid capacity that does."""
    found: dict[str, dict[str, Any]] = {}
    for policy, caps in table.items():
        if policy == "lru" and curve is not None:
            capacity = curve.smallest_capacity(target)
            ratio = None if capacity is None else curve.block_hit_ratio(capacity)
            found[policy] = {"capacity": capacity, "block_hit_ratio": ratio, "exact": True}
            continue
        hit = next(((c, t) for c, t in caps.items() if (t.block_hit_ratio or 0.0) >= target - 1e-12), None)
        found[policy] = {
            "capacity": hit[0] if hit else None,
            "block_hit_ratio": hit[1].block_hit_ratio if hit else None,
            "exact": False,
        }
    return found


DEFAULT_TARGET_SHARE = 0.9


def default_target(table: Mapping[str, Mapping[int, Totals]], curve: HitRatioCurve | None) -> float:
    """90 % of the best block hit ratio anything in the sweep reaches: the capacity past
    which more cache buys little."""
    ratios = [t.block_hit_ratio or 0.0 for caps in table.values() for t in caps.values()]
    if curve is not None:
        ratios.append(curve.block_hit_ratio(curve.saturation_capacity) or 0.0)
    return round(DEFAULT_TARGET_SHARE * max(ratios, default=0.0), 6)


def build_report(
    *,
    trace: Mapping[str, Any],
    settings: Mapping[str, Any],
    points: Sequence[PointResult],
    duration_s: float,
    target: float | None,
    cost: CostModel,
    curve: HitRatioCurve | None = None,
    plan: CapacityPlan | None = None,
) -> dict[str, Any]:
    """Assemble the report dictionary (JSON-able). ``target`` None means
    :func:`default_target`; with a ``plan``, capacities also come in GiB, priced against
    the GPU time they save, with the quota to configure in KVCM."""
    table = aggregate(points)
    target_rule = "given"
    if target is None:
        target, target_rule = default_target(table, curve), "90% of the best hit ratio"
    policies = {
        policy: {
            "capacities": list(caps),
            "block_hit_ratio": [t.block_hit_ratio for t in caps.values()],
            "token_hit_ratio": [t.token_hit_ratio for t in caps.values()],
            "external_block_hit_ratio": [t.external_block_hit_ratio for t in caps.values()],
        }
        for policy, caps in table.items()
    }
    savings = [
        {
            "policy": policy,
            "capacity": capacity,
            "block_hit_ratio": t.block_hit_ratio,
            "token_hit_ratio": t.token_hit_ratio,
            **cost.savings(t.external_hit_tokens, duration_s),
        }
        for policy, caps in table.items()
        for capacity, t in caps.items()
    ]
    smallest = smallest_capacities(table, target, curve)
    reachable = [(v["capacity"], policy) for policy, v in smallest.items() if v["capacity"] is not None]
    recommendation = None
    if reachable:
        capacity, policy = min(reachable, key=lambda cp: (cp[0], cp[1] != "lru"))
        totals = curve.totals(capacity) if policy == "lru" and curve is not None else table[policy][capacity]
        recommendation = {
            "policy": policy,
            "capacity": capacity,
            "block_hit_ratio": totals.block_hit_ratio,
            "token_hit_ratio": totals.token_hit_ratio,
            **cost.savings(totals.external_hit_tokens, duration_s),
        }
    curve_part = None
    if curve is not None:
        grid = [c for caps in table.values() for c in caps if c > 0] or [1]
        high = max(curve.saturation_capacity, max(grid)) * 2
        curve_part = curve.to_dict(log_capacities(max(1, min(grid) // 2), high, 120))
    report = {
        "trace": dict(trace),
        "settings": dict(settings),
        "target_hit_ratio": target,
        "target_rule": target_rule,
        "policies": policies,
        "points": [p.to_dict() for p in points],
        "smallest_capacity": smallest,
        "recommendation": recommendation,
        "savings": savings,
        "cost_model": cost.to_dict(),
        "curve": curve_part,
        "timeseries": None,
        "plots": [],
        "assumptions": ([trace["workload"]["description"]] if "workload" in trace else [])
        + cost.assumptions()
        + [f"target {target:.1%} ({target_rule})"],
    }
    if plan is not None:
        _plan_capacities(report, plan, table, cost, duration_s, curve)
    return report


def _plan_capacities(
    report: dict[str, Any],
    plan: CapacityPlan,
    table: Mapping[str, Mapping[int, Totals]],
    cost: CostModel,
    duration_s: float,
    curve: HitRatioCurve | None,
) -> None:
    """Add GiB, storage cost and net per capacity, the net-optimal capacity and the KVCM
    quota of the recommendation to ``report``."""

    def row(policy: str, capacity: int, totals: Totals) -> dict[str, Any]:
        savings = cost.savings(totals.external_hit_tokens, duration_s)
        return plan.row(policy, capacity, totals.block_hit_ratio, savings, POLICIES[policy].watermark_simulated)

    rows = [row(policy, c, t) for policy, caps in table.items() for c, t in caps.items()]
    curve_rows = []
    if curve is not None and report["curve"] is not None:
        curve_rows = [row("lru", c, curve.totals(c)) for c in report["curve"]["capacities"]]
    priced = [r for r in rows + curve_rows if r["net_per_hour"] is not None]
    report["plan"] = plan.to_dict()
    report["assumptions"] += plan.assumptions()
    report["net"] = rows
    report["net_curve"] = curve_rows
    report["net_optimal"] = max(priced, key=lambda r: r["net_per_hour"], default=None)
    rec = report["recommendation"]
    report["quota"] = report["break_even"] = None
    if rec is not None:
        simulated = POLICIES[rec["policy"]].watermark_simulated
        rec.update(
            {
                k: v
                for k, v in plan.row(rec["policy"], rec["capacity"], rec["block_hit_ratio"], rec, simulated).items()
                if k not in ("policy", "block_hit_ratio")
            }
        )
        report["quota"] = _live_quota(report, plan)
        report["break_even"] = break_even(
            rec, [r for r in rows + curve_rows if r["policy"] == rec["policy"]], report["trace"], cost
        )


#: KVCM's reclaim_policy names of the kvcm policy's orders.
_RECLAIM_POLICIES = {"lru": "POLICY_LRU", "lfu": "POLICY_LFU", "ttl": "POLICY_TTL"}


def _live_quota(report: Mapping[str, Any], plan: CapacityPlan) -> dict[str, Any] | None:
    """The quota to configure: the capacity at which the policy KVCM runs (``kvcm``,
    watermark simulated) reaches the target, else the recommendation's plus the
    watermark."""
    live = report["smallest_capacity"].get(KVCMPolicy.name)
    if live is not None and live["capacity"] is not None:
        params = report["settings"].get("policy_params", {}).get(KVCMPolicy.name, {})
        return plan.quota(
            KVCMPolicy.name,
            live["capacity"],
            watermark_simulated=True,
            reclaim_policy=_RECLAIM_POLICIES[params.get("order", "lru")],
        )
    rec = report["recommendation"]
    return plan.quota(rec["policy"], rec["capacity"])


def break_even(
    rec: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], trace: Mapping[str, Any], cost: CostModel
) -> dict[str, Any] | None:
    """Where the recommended cache stops paying: the traffic and the GPU price at which
    its GPU time saved equals its storage cost (savings scale with traffic at the same hit
    ratio, storage does not), and the largest capacity of its policy that still pays."""
    saved, storage = rec.get("gpu_cost_saved_per_hour"), rec["storage_cost_per_hour"]
    if saved is None:
        return None
    duration = trace.get("duration_s") or 0.0
    rate = trace["reads"] / duration if duration > 0 and trace.get("reads") else None
    share = storage / saved if saved > 0 else math.inf
    rows = sorted(rows, key=lambda r: r["capacity_blocks"])
    paying = [r["capacity_blocks"] for r in rows if (r["net_per_hour"] or 0.0) >= 0]
    if rows and paying and paying[-1] == rows[-1]["capacity_blocks"] and paying[-1] > 0:
        # past the last row the savings are taken as flat (the LRU curve runs to twice
        # its saturation; for a grid this is a floor) and the storage grows: it pays
        # until the storage reaches the last row's savings
        last = rows[-1]
        per_block = last["storage_cost_per_hour"] / last["capacity_blocks"]
        if per_block > 0:
            paying.append(int(last["gpu_cost_saved_per_hour"] / per_block))
    return {
        "traffic_share": share,
        "request_rate": None if rate is None or math.isinf(share) else rate * share,
        "current_request_rate": rate,
        "gpu_hour_price": None if math.isinf(share) else cost.gpu_hour_price * share,
        "largest_paying_capacity": max(paying, default=None),
    }


def attach_timeseries(report: dict[str, Any], result: ReplayResult) -> None:
    """Record in ``report`` which replay the time series (CSV and plot) come from."""
    report["timeseries"] = {
        "policy": result.config.policy,
        "capacity": result.config.capacity,
        "window_s": result.config.window_s,
        "csv": TIMESERIES_CSV,
        "windows": len(result.windows),
        "instances": {name: t.to_dict() for name, t in result.instances.items()},
    }


def _thousands(value: float, _: Any = None) -> str:
    return f"{value:,.0f}" if value >= 1 else f"{value:g}"


def _plot_capacity(report: Mapping[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, PercentFormatter

    plan: dict[str, Any] = report.get("plan") or {}
    assumptions = report.get("assumptions", [])
    if plan:
        fig, (ax, money) = plt.subplots(
            2, 1, figsize=(10, 9.5), dpi=120, sharex=True, gridspec_kw={"height_ratios": [3, 2]}
        )
    else:
        fig, ax = plt.subplots(figsize=(10, 6.5), dpi=120)
        money = None
    curve = report.get("curve")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    markers = "osD^vP*X"
    policies = sorted(report["policies"].items(), key=lambda item: (item[0] != "lru", item[0]))
    grid = [c for _, data in policies for c in data["capacities"] if c > 0]
    low, high = min(grid, default=1) / 2, max(grid, default=1) * 2
    for n, (policy, data) in enumerate(policies):
        color, marker = colors[n % len(colors)], markers[n % len(markers)]
        caps = [c for c in data["capacities"] if c > 0]
        ratios = [r for c, r in zip(data["capacities"], data["block_hit_ratio"], strict=True) if c > 0]
        if policy == "lru" and curve:
            # the exact curve over the plotted range: a bit wider than the grid
            dense = [
                (c, r)
                for c, r in zip(curve["capacities"], curve["block_hit_ratio"], strict=True)
                if r is not None and low <= c <= high
            ]
            ax.plot(
                [c for c, _ in dense], [r for _, r in dense], "-", color=color, lw=2, label="lru (exact one-pass curve)"
            )
            ax.plot(caps, ratios, marker, color=color, ms=6)
        else:
            name = "kvcm = KVCM's reclaimer" if policy == KVCMPolicy.name else policy
            ax.plot(
                caps, ratios, marker + "--", color=color, ms=6, lw=1.5, mfc="none", mew=1.5, label=f"{name} (replay)"
            )
        if money is not None:
            _plot_net(money, report, policy, color, marker, low, high)
    target = report["target_hit_ratio"]
    ax.axhline(target, color="grey", ls=":", lw=1.2, label=f"target {target:.1%}")
    rec = report.get("recommendation")
    if rec:
        size = f" = {rec['capacity_gib']:,.0f} GiB" if "capacity_gib" in rec else ""
        for axis in (ax, money):
            if axis is not None:
                axis.axvline(rec["capacity"], color="grey", ls="--", lw=0.8)
        ax.annotate(
            f"{rec['policy']} reaches {target:.1%}\nat {rec['capacity']:,} blocks{size}",
            xy=(rec["capacity"], rec["block_hit_ratio"]),
            xytext=(-170, 14),
            textcoords="offset points",
            fontsize=9,
            bbox={"boxstyle": "round", "fc": "white", "ec": "grey", "alpha": 0.9},
            arrowprops={"arrowstyle": "->", "color": "grey"},
        )
    quota = report.get("quota")
    if quota is not None:
        ax.axvline(
            quota["max_key_count"],
            color="black",
            ls="-.",
            lw=1,
            label=f"KVCM quota: {quota['max_key_count']:,} blocks ({quota['group_quota']}) for {quota['policy']}",
        )
    ax.set_xscale("log")
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_ylim(bottom=0)
    mode = report["settings"].get("mode", "instance_precise")
    per = "shared by the group" if mode == "group_rough" else "per instance"
    bottom = money if money is not None else ax
    bottom.xaxis.set_major_formatter(FuncFormatter(_thousands))
    bottom.set_xlabel(f"cache capacity (blocks {per}, log scale)")
    ax.set_ylabel("block hit ratio")
    ax.set_title(f"Hit ratio vs capacity - {report['trace'].get('name', 'trace')}")
    if plan:
        gib_per_block = plan["block_bytes"] / 2**30
        top = ax.secondary_xaxis("top", functions=(lambda b: b * gib_per_block, lambda g: g / gib_per_block))
        top.xaxis.set_major_formatter(FuncFormatter(_thousands))
        top.set_xlabel("GiB per instance")
    for axis in (ax, money):
        if axis is not None:
            axis.grid(True, which="major", alpha=0.35)
            axis.grid(True, which="minor", alpha=0.12)
    ax.legend(loc="upper left", fontsize=9)
    if money is not None:
        money.axhline(0, color="black", lw=0.8)
        money.set_ylabel(f"{plan['currency']} per hour")
        money.set_title("Value per hour: GPU time saved minus the storage of the quota", fontsize=10)
        # two columns in the empty upper left (savings are small at small capacities)
        money.legend(loc="upper left", fontsize=8, ncol=2)
        # storage grows without bound with capacity: keep the region where the savings are
        rows = report["net"] + report["net_curve"]
        top = max((r["gpu_cost_saved_per_hour"] or 0.0 for r in rows), default=0.0)
        lows = [v for r in rows for v in (r["net_per_hour"], -r["storage_cost_per_hour"]) if v is not None]
        if top > 0 and lows:
            money.set_ylim(1.05 * min(-0.1 * top, max(min(lows), -3 * top)), 1.6 * top)  # legend room
    lines = [part for line in assumptions for part in textwrap.wrap(line, 130, subsequent_indent="    ")]
    if lines:
        fig.text(
            0.01,
            0.005,
            "assumptions:\n" + "\n".join(lines),
            fontsize=7.5,
            va="bottom",
            ha="left",
            family="monospace",
            color="dimgrey",
        )
    fig.tight_layout(rect=(0, 0.0125 * (len(lines) + 2) if lines else 0, 1, 1))
    fig.savefig(path)
    plt.close(fig)


def _plot_net(
    axis: Any, report: Mapping[str, Any], policy: str, color: str, marker: str, low: float, high: float
) -> None:
    """Net value per hour of ``policy``'s capacities: GPU time saved minus storage."""
    currency = report["plan"]["currency"]
    if policy == "lru" and report.get("net_curve"):
        rows = [r for r in report["net_curve"] if low <= r["capacity_blocks"] <= high and r["net_per_hour"] is not None]
        caps = [r["capacity_blocks"] for r in rows]
        axis.plot(caps, [r["net_per_hour"] for r in rows], "-", color=color, lw=2, label="lru net (saved - storage)")
        axis.plot(
            caps, [r["gpu_cost_saved_per_hour"] for r in rows], ":", color=color, lw=1.2, label="lru GPU time saved"
        )
        axis.plot(
            caps,
            [-r["storage_cost_per_hour"] for r in rows],
            "-.",
            color="grey",
            lw=1.2,
            label="storage cost (negative)",
        )
        best = report.get("net_optimal")
        if best is not None:
            axis.plot(
                [best["capacity_blocks"]],
                [best["net_per_hour"]],
                "*",
                color="black",
                ms=12,
                label=f"net-optimal: {best['policy']} at "
                f"{best['capacity_blocks']:,} blocks "
                f"({_money(best['net_per_hour'])} {currency}/h)",
            )
    else:
        rows = sorted(
            (
                r
                for r in report["net"]
                if r["policy"] == policy and r["capacity_blocks"] > 0 and r["net_per_hour"] is not None
            ),
            key=lambda r: r["capacity_blocks"],
        )
        axis.plot(
            [r["capacity_blocks"] for r in rows],
            [r["net_per_hour"] for r in rows],
            marker + "--",
            color=color,
            ms=5,
            lw=1.2,
            mfc="none",
            label=f"{policy} net",
        )


def _plot_timeseries(result: ReplayResult, path: Path, plan: Mapping[str, Any] | None = None, top: int = 8) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import PercentFormatter

    by_instance: dict[str, list[Any]] = {}
    for window in result.windows:
        by_instance.setdefault(window.instance, []).append(window)
    ranked = sorted(by_instance, key=lambda i: -result.instances[i].read_blocks)
    shown = ranked[:top]
    span = max((w.end_s for w in result.windows), default=0.0)
    unit, scale = ("hours", 3600.0) if span > 3 * 3600 else ("minutes", 60.0)
    fig, ax = plt.subplots(figsize=(10, 5.5), dpi=120)
    volume = ax.twinx()
    totals: dict[float, int] = {}
    for window in result.windows:
        totals[window.start_s] = totals.get(window.start_s, 0) + window.totals.read_blocks
    width = result.config.window_s / scale
    volume.bar(
        [s / scale + width / 2 for s in totals],
        list(totals.values()),
        width=width * 0.9,
        color="lightgrey",
        alpha=0.6,
        label="blocks read (right axis)",
    )
    volume.set_ylabel("blocks read per window")
    # keep the volume bars in the lower third, under the hit-ratio lines and the legend
    volume.set_ylim(0, 3 * max(totals.values(), default=1))
    ax.set_zorder(volume.get_zorder() + 1)
    ax.patch.set_visible(False)
    for instance in shown:
        windows = [w for w in by_instance[instance] if w.totals.read_blocks]
        label = instance if len(instance) <= 24 else instance[:21] + "..."
        ax.plot(
            [(w.start_s + result.config.window_s / 2) / scale for w in windows],
            [w.totals.block_hit_ratio for w in windows],
            "-o",
            ms=3,
            lw=1.4,
            label=label,
        )
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_ylim(0, 1)
    ax.set_xlabel(f"time since trace start ({unit})")
    ax.set_ylabel("block hit ratio per window")
    config = result.config
    hidden = len(ranked) - len(shown)
    size = f" ({config.capacity * plan['block_bytes'] / 2**30:,.0f} GiB)" if plan else ""  # as the capacity plot
    title = (
        f"{config.policy} at {config.capacity:,} blocks{size} per instance: hit ratio per {config.window_s:g} s window"
    )
    ax.set_title(title + (f" (top {top} of {len(ranked)} instances)" if hidden else ""))
    ax.grid(True, alpha=0.35)
    lines, labels = ax.get_legend_handles_labels()
    bars, bar_labels = volume.get_legend_handles_labels()
    ax.legend(lines + bars, labels + bar_labels, loc="upper right", fontsize=9, title="instance")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_report(report: dict[str, Any], out_dir: str | Path, *, timeseries: ReplayResult | None = None) -> list[Path]:
    """Write report.json, the time-series CSV and the PNG plots into ``out_dir``.

    Plots need matplotlib (Agg backend); without it the report lists no plots and says why.
    Returns the written files.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    if timeseries is not None:
        attach_timeseries(report, timeseries)
        with open(out / TIMESERIES_CSV, "w", newline="", encoding="utf-8") as handle:
            timeseries.write_timeseries_csv(handle)
        written.append(out / TIMESERIES_CSV)
    try:
        import matplotlib

        matplotlib.use("Agg")
    except ImportError:
        report["plots_skipped"] = "matplotlib is not installed"
    else:
        _plot_capacity(report, out / CAPACITY_PNG)
        report["plots"] = [CAPACITY_PNG]
        written.append(out / CAPACITY_PNG)
        if timeseries is not None and timeseries.windows:
            _plot_timeseries(timeseries, out / TIMESERIES_PNG, report.get("plan"))
            report["plots"].append(TIMESERIES_PNG)
            written.append(out / TIMESERIES_PNG)
    with open(out / REPORT_JSON, "w", encoding="utf-8") as handle:
        json.dump(for_people(report), handle, indent=2)
        handle.write("\n")
    written.append(out / REPORT_JSON)
    return written


def summary_line(report: Mapping[str, Any]) -> str:
    """One human sentence for a terminal."""
    rec = report.get("recommendation")
    target = report["target_hit_ratio"]
    if not rec:
        return f"no capacity in the sweep reaches a {target:.0%} block hit ratio"
    size = f" ({rec['capacity_gib']:,.0f} GiB)" if "capacity_gib" in rec else ""
    gpus = rec.get("gpus")
    extra = (
        ""
        if gpus is None
        else (f", saving {gpus:.2f} GPUs on average ({rec['cost_per_hour']:.2f} {rec['currency']}/h)")
    )
    return f"{rec['policy']} reaches {target:.0%} block hit ratio at {rec['capacity']:,} blocks{size}{extra}"


def _money(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+,.2f}" if abs(value) >= 0.01 else f"{value:+.2g}"


def summary_lines(report: Mapping[str, Any]) -> list[str]:
    """The report for a terminal: the answer, the assumptions, the net per capacity and
    the quota to configure."""
    lines = [summary_line(report), "assumptions:"]
    lines += [f"  {a}" for a in report.get("assumptions", [])]
    if "net" not in report:
        return lines
    currency = report["plan"]["currency"]
    lines.append(
        f"  {'policy':<16}{'blocks':>10}{'GiB':>10}{'hit ratio':>11}{'GPUs saved':>12}"
        f"{'saved/h':>10}{'storage/h':>11}{'net/h':>10}  ({currency})"
    )
    for r in sorted(report["net"], key=lambda r: (r["policy"] != "lru", r["policy"], r["capacity_blocks"])):
        gpus = "n/a" if r["gpus_saved"] is None else f"{r['gpus_saved']:.2f}"
        ratio = "n/a" if r["block_hit_ratio"] is None else f"{r['block_hit_ratio']:.1%}"
        lines.append(
            f"  {r['policy']:<16}{r['capacity_blocks']:>10,}{r['capacity_gib']:>10,.0f}"
            f"{ratio:>11}{gpus:>12}{_money(r['gpu_cost_saved_per_hour']):>10}"
            f"{_money(-r['storage_cost_per_hour']):>11}{_money(r['net_per_hour']):>10}"
        )
    best = report.get("net_optimal")
    if best is not None:
        verdict = (
            "the cache pays for itself" if best["net_per_hour"] > 0 else "no capacity pays for itself at these prices"
        )
        lines.append(
            f"net-optimal: {best['policy']} at {best['capacity_blocks']:,} blocks "
            f"({best['capacity_gib']:,.0f} GiB), net {_money(best['net_per_hour'])} "
            f"{currency}/h: {verdict}"
        )
    even = report.get("break_even")
    if even is not None and even["request_rate"] is not None:
        lines.append(
            f"break-even of the recommendation: {even['request_rate']:.3g} requests/s "
            f"({even['traffic_share']:.0%} of the {even['current_request_rate']:.3g}/s here) "
            f"or a GPU price of {even['gpu_hour_price']:.3g} {currency}/GPU-h; it pays up to "
            + (
                "no capacity"
                if even["largest_paying_capacity"] is None
                else f"{even['largest_paying_capacity']:,} blocks"
            )
        )
    quota = report.get("quota")
    if quota is not None:
        lines.append(
            f"KVCM quota for {quota['policy']} at the target: max_key_count "
            f"{quota['max_key_count']:,} per instance, group quota "
            f"{quota['group_quota']} ({quota['group_quota_bytes']:,} bytes) on "
            f"{report['plan']['storage_tier']['storage_type']}, used_percentage "
            f"{report['plan']['used_percentage']:g}"
        )
    return lines


def flatten_results(results: Iterable[Any]) -> list[dict[str, Any]]:
    """Flatten the nested lists a Step Functions Map of Maps returns."""
    flat: list[dict[str, Any]] = []
    for item in results:
        if isinstance(item, list):
            flat.extend(flatten_results(item))
        elif isinstance(item, dict):
            flat.append(item)
    return flat
