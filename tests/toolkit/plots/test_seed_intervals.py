"""Policies over seeds with 95% intervals (toolkit.queries.seeds, toolkit.plots.seeds,
`pdlab sweep --plot`): the intervals are Student-t's, the change against a baseline is
paired by seed, and a real (tiny) sweep becomes a figure whose error bars are those."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from scipy import stats
from typer.testing import CliRunner

from cluster.sweep import SweepSpec, run_sweep
from toolkit.cli import app
from toolkit.plots.seeds import draw_seed_intervals, format_interval, sweep_intervals
from toolkit.queries.seeds import seed_intervals, sweep_rows, t_interval

ROWS = pl.DataFrame(
    {
        "policy": ["a"] * 4 + ["b"] * 4 + ["c"] * 4,
        "seed": [0, 1, 2, 3] * 3,
        "jct": [10.0, 14.0, 9.0, 13.0, 12.0, 15.5, 10.0, 16.0, 10.0, 14.0, 9.0, 13.0],
    }
)


def test_t_interval_is_scipys():
    x = [10.0, 14.0, 9.0, 13.0]
    mean, lo, hi = t_interval(x)
    want = stats.t.interval(0.95, len(x) - 1, loc=np.mean(x), scale=stats.sem(x))
    assert mean == pytest.approx(11.5) and (lo, hi) == pytest.approx(want)
    assert t_interval([3.0]) == (3.0, None, None)


def test_intervals_rank_and_pair_by_seed():
    got = seed_intervals(ROWS, "jct", baseline="a")
    t = {r["policy"]: r for r in got.table.iter_rows(named=True)}
    assert [r["policy"] for r in got.table.iter_rows(named=True)][-1] == "b"  # worst last
    assert t["a"]["rank"] == t["c"]["rank"] == 1 and t["b"]["rank"] == 3
    ratios = np.array([12 / 10, 15.5 / 14, 10 / 9, 16 / 13]) - 1
    lo, hi = stats.t.interval(0.95, 3, loc=ratios.mean(), scale=stats.sem(ratios))
    assert t["b"]["change"] == pytest.approx(ratios.mean())
    assert (t["b"]["change_lo"], t["b"]["change_hi"]) == pytest.approx((lo, hi))
    # Paired: b is worse under every seed, so its change excludes 0 although the unpaired
    # intervals of a and b overlap.
    assert t["b"]["change_lo"] > 0 and t["b"]["lo"] < t["a"]["hi"]
    assert t["c"]["change"] == t["c"]["change_lo"] == t["c"]["change_hi"] == 0  # equal per seed
    assert t["a"]["change"] == 0 and t["a"]["change_lo"] is None  # the baseline itself
    higher = seed_intervals(ROWS, "jct", lower_is_better=False)
    assert higher.table["policy"][0] == "b" and higher.baseline is None
    with pytest.raises(ValueError, match="baseline 'z' is not one of the policies"):
        seed_intervals(ROWS, "jct", baseline="z")
    with pytest.raises(ValueError, match="rows have no column 'ttft'"):
        seed_intervals(ROWS, "ttft")


def test_the_figure_draws_the_intervals_and_the_changes():
    got = seed_intervals(ROWS.rename({"jct": "mean_jct_s"}), "mean_jct_s", baseline="a")
    fig = draw_seed_intervals(got)
    means, seeds, change = fig.data
    assert list(means.y) == got.table["policy"].to_list()
    assert list(means.error_x.array) == pytest.approx(
        (got.table["hi"] - got.table["mean"]).to_list()
    )
    assert len(seeds.x) == 12 and list(change.y) == ["c", "b"]
    assert fig.layout.xaxis.title.text == "mean job completion time (s)"
    assert "paired by seed" in fig.layout.annotations[1].text
    assert format_interval("kv_hit_rate", 0.5, 0.4, 0.6) == "50.0% [40.0%, 60.0%]"


def test_a_real_sweep_to_a_figure_and_the_cli(tmp_path: Path):
    spec = SweepSpec(
        base={"nodes": 2, "split": "1P1D", "agents": 4, "duration_s": 60.0, "warmup_s": 10.0},
        grid={"router": ["ttft", "round-robin"]},
        seeds=(0, 1),
    )
    rows = run_sweep(spec, processes=1)
    table = sweep_rows(rows, "mean_e2e_s")
    assert table["policy"].unique().sort().to_list() == ["router=round-robin", "router=ttft"]
    fig = sweep_intervals(rows, "mean_e2e_s")
    base = [r["mean_e2e_s"] for r in rows if r["point"] == 0]
    assert fig.layout.meta["table"][0]["seeds"] == 2
    assert np.mean(base) in [pytest.approx(r["mean"]) for r in fig.layout.meta["table"]]
    out = tmp_path / "sweep.html"
    args = ["sweep", "--base", "nodes=2", "--base", "split=1P1D", "--base", "agents=4",
            "--base", "duration_s=60", "--base", "warmup_s=10", "--grid", "router=ttft,round-robin",
            "--seeds", "0,1", "--processes", "1"]  # fmt: skip
    res = CliRunner().invoke(app, [*args, "--plot", str(out), "--plot-metric", "mean_e2e_s"])
    assert res.exit_code == 0, res.output
    assert "mean end-to-end latency (s) by point over seeds" in out.read_text()
    bad = CliRunner().invoke(app, [*args, "--plot", str(out), "--plot-metric", "nope"])
    assert bad.exit_code == 2 and "--plot-metric must be one of" in bad.output
