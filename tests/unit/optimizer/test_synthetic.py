"""Synthetic workloads: parsing, the distributions they promise, prefix-aware block ids,
and the ROI report of a model not served yet."""

from __future__ import annotations

import io
import itertools
import json
import random
import statistics

import pytest

from chalicelib.optimizer.cli import main
from chalicelib.optimizer.errors import ConfigError
from chalicelib.optimizer.synthetic import Distribution, Workload, requests, write_trace


def test_workload_parsing():
    w = Workload.parse("rate=2, duration=60,prompt=uniform:10:20,system_prompts=3,followup=0.25")
    assert (w.rate, w.duration, w.system_prompts, w.followup) == (2.0, 60.0, 3, 0.25)
    assert w.prompt == Distribution("uniform", 10, 20) and str(w.prompt) == "uniform:10:20"
    for bad in (
        "rate=0",
        "followup=1",
        "colour=red",
        "rate",
        "rate=fast",
        "prompt=gauss:1",
        "prompt=uniform:5:1",
        "system_prompts=0",
    ):
        with pytest.raises(ConfigError):
            Workload.parse(bad)


def test_distributions_draw_what_they_say():
    rng = random.Random(1)
    draws = [Distribution("lognormal", 1000, 0.5).draw(rng) for _ in range(4000)]
    assert statistics.median(draws) == pytest.approx(1000, rel=0.05)
    assert statistics.mean(draws) == pytest.approx(Distribution("lognormal", 1000, 0.5).mean(), rel=0.05)
    assert {Distribution("fixed", 7).draw(rng) for _ in range(5)} == {7}
    assert all(3 <= Distribution("uniform", 3, 5).draw(rng) <= 5 for _ in range(100))


def test_requests_follow_the_rate_the_turns_and_the_prefixes():
    w = Workload(
        rate=4,
        duration=1800,
        prompt=Distribution("fixed", 100),
        output=Distribution("fixed", 40),
        system=64,
        system_prompts=2,
        followup=0.6,
        think=30,
        seed=3,
    )
    reqs = list(requests(w, block_size=16))
    assert len(reqs) == pytest.approx(4 * 1800, rel=0.1)
    times = [r["timestamp"] for r in reqs]
    assert times == sorted(times) and times[-1] <= 1800 * 1000
    parents: dict[int, int | None] = {}
    first_blocks = set()
    for r in reqs:
        ids = r["hash_ids"]
        assert len(ids) == r["input_length"] // 16
        first_blocks.add(ids[0])
        for parent, block in itertools.pairwise([None, *ids]):
            # prefix-aware: a block id always follows the same prefix
            assert parents.setdefault(block, parent) == parent
    assert len(first_blocks) == 2  # the 64-token system prompts: 4 blocks each, 2 prompts
    # a follow-up carries its whole conversation: it starts with an earlier request's blocks
    seen: set[tuple[int, ...]] = set()
    continued = 0
    for r in reqs:
        ids = tuple(r["hash_ids"])
        continued += any(ids[:n] in seen for n in (len(ids) - 9, len(ids) - 8, len(ids) - 7) if n > 4)
        seen.update(ids[:n] for n in range(5, len(ids) + 1))
    assert continued / len(reqs) == pytest.approx(0.6, abs=0.05)
    out = io.StringIO()
    assert write_trace(w, 16, out) == len(reqs)
    assert json.loads(out.getvalue().splitlines()[0]) == reqs[0]
    assert list(requests(w, 16)) == reqs  # seeded


def test_report_of_a_synthetic_workload_answers_roi(tmp_path, capsys):
    out = tmp_path / "roi"
    assert (
        main(
            [
                "report",
                "--out",
                str(out),
                "--model",
                "qwen2.5-7b",
                "--storage-tier",
                "ssd",
                "--workload",
                "rate=2,duration=600,prompt=lognormal:800:0.8,system=512,followup=0.5,think=30",
                "--policies",
                "lru",
                "--workers",
                "1",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "synthetic: 2 req/s for 600 s" in text and "break-even" in text
    report = json.loads((out / "report.json").read_text())
    assert (out / "synthetic_trace.jsonl").exists()
    assert report["trace"]["workload"]["followup"] == 0.5
    assert report["trace"]["block_size"] == 16
    rec, even = report["recommendation"], report["break_even"]
    assert rec["capacity_gib"] > 0 and rec["gpus"] > 0 and rec["storage_cost_per_hour"] > 0
    # break-even traffic: where the savings, proportional to traffic, meet the storage
    assert even["traffic_share"] == pytest.approx(
        rec["storage_cost_per_hour"] / rec["gpu_cost_saved_per_hour"], rel=1e-3
    )
    assert even["request_rate"] == pytest.approx(even["traffic_share"] * even["current_request_rate"], rel=1e-3)
    assert main(["report", "--out", str(out)]) == 2  # neither --trace nor --workload
    assert main(["report", "--out", str(out), "--workload", "rate=1,duration=0.001"]) == 2
