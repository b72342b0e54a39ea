"""`mrc --sample-rate` on the shared trace prints its error against the exact curve: mean,
max and the capacity of the max, at the capacities asked and over a log grid up to
saturation (where the steep part of the curve is)."""

from __future__ import annotations

import re

from chalicelib.optimizer.cli import SHARDS_GRID_POINTS, main
from chalicelib.optimizer.mrc import lru_curve, shards_error
from chalicelib.optimizer.report import log_capacities
from chalicelib.optimizer.traces import read_trace
from tests.helpers import CONVERSATION

LINE = re.compile(r"  (.+): mean (\d\.\d{4}), max (\d\.\d{4}) at ([\d,]+) blocks \(([+-]\d\.\d{4})\)")


def test_mrc_prints_the_sampled_curves_error_against_the_exact_one(capsys):
    assert (
        main(
            [
                "mrc",
                "--trace",
                str(CONVERSATION),
                "--format",
                "mooncake",
                "--capacities",
                "1k,5k,10k,20k,50k",
                "--sample-rate",
                "0.01",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    asked, grid = [LINE.fullmatch(line).groups() for line in out.splitlines() if LINE.fullmatch(line)]
    records = list(read_trace(CONVERSATION, "mooncake"))
    exact = lru_curve(records, block_size=512)
    sampled = lru_curve(records, block_size=512, sample_rate=0.01)
    top = exact.saturation_capacity
    for (name, mean, worst, at, signed), caps in (
        (asked, [1000, 5000, 10000, 20000, 50000]),
        (grid, log_capacities(top // 2000, top, SHARDS_GRID_POINTS)),
    ):
        error = shards_error(exact, sampled, caps)
        assert (float(mean), float(worst), int(at.replace(",", "")), float(signed)) == (
            round(error["mean_abs_error"], 4),
            round(error["max_abs_error"], 4),
            error["max_at_capacity"],
            round(error["error_at_max"], 4),
        ), name
    assert grid[0].startswith(f"over {SHARDS_GRID_POINTS} log-spaced capacities")
    # the documented figures (docs/optimizer.md): within 0.01 at the five capacities asked
    assert float(asked[2]) <= 0.01
