"""The replay engine on the real trace and on hand-made cases."""

from __future__ import annotations

import csv
import io

import pytest

from chalicelib.optimizer.replay import ReplayConfig, Totals, read_timeseries_csv, replay

README = {1000: 0.04453, 5000: 0.11182, 10000: 0.21160, 20000: 0.28782, 50000: 0.35456}


@pytest.mark.parametrize("capacity", sorted(README))
def test_lru_replay_reproduces_the_readme(conversation, capacity):
    result = replay(conversation, ReplayConfig(capacity=capacity, block_size=512))
    assert round(result.totals.block_hit_ratio, 5) == README[capacity]
    assert result.totals.read_blocks == 288_500 and result.block_accesses == 288_500


def test_totals_windows_and_csv_agree(conversation):
    result = replay(conversation, ReplayConfig(capacity=20000, block_size=512, window_s=300))
    t = result.totals
    assert t.reads == 12_031 and t.written_blocks == 288_500
    # token hits are capped by input_length (the last block of a request is partial)
    assert t.input_tokens == 144_793_823 and t.hit_tokens < t.hit_blocks * 512
    assert result.duration_s == pytest.approx(3536.999)
    assert len(result.windows) == 12  # 3537 s in 300 s windows
    summed = Totals()
    for window in result.windows:
        summed.add(window.totals)
        assert 0 <= window.cached_blocks <= 20000
    assert summed == t == result.instances["default"]
    out = io.StringIO()
    result.write_timeseries_csv(out)
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert len(rows) == 12 and rows[0]["instance"] == "default"
    assert sum(int(r["external_hit_blocks"]) for r in rows) == t.external_hit_blocks
    back = read_timeseries_csv(io.StringIO(out.getvalue()), result.config)
    assert back.totals == t and [w.totals for w in back.windows] == [w.totals for w in result.windows]
