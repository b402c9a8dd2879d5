"""Request-level figures: lost KV reuse, latency CDFs and per-node load, checked against
direct computations over the requests and iteration tables."""

from __future__ import annotations

import math

import duckdb
import numpy as np
import polars as pl
import pytest

from telemetry import TelemetryWriter
from toolkit.plots import latency_distributions, lost_kv_reuse, node_load
from toolkit.plots.common import percent_axis
from toolkit.queries import latency as latency_module

WARMUP_S = 100.0


def _df(db, sql: str) -> pl.DataFrame:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.sql(sql).pl()


@pytest.fixture(scope="module")
def measured(sim_run) -> pl.DataFrame:
    """Requests that started prefill after the warmup (the run summary's population)."""
    return _df(
        sim_run.db,
        f"SELECT * FROM requests WHERE run_id = '{sim_run.run_id}' "
        f"AND t_prefill_start IS NOT NULL AND t_arrival >= {WARMUP_S}",
    )


def test_lost_kv_reuse_matches_a_direct_computation(sim_run, measured):
    fig = lost_kv_reuse(sim_run.db, sim_run.run_id)
    tot = fig.layout.meta["totals"]
    t_in, t_c, t_ideal = (float(measured[c].sum()) for c in ("t_in", "t_c", "t_ideal_c"))
    h, h_star = t_c / t_in, t_ideal / t_in
    assert tot["requests"] == measured.height
    assert tot["h"] == pytest.approx(h, rel=1e-12)
    assert tot["h_star"] == pytest.approx(h_star, rel=1e-12)
    assert tot["lost"] == pytest.approx(1 - h / h_star, rel=1e-12)
    assert tot["lost"] > 0.01  # the small KV tiers and switches of this run do lose reuse
    # Per 10 s bin of prefill start (bins of 400 s / 40).
    (bars,) = [t for t in fig.data if t.name == "lost KV reuse 1 − h/h*"]
    per_bin = (
        measured.with_columns(b=(pl.col("t_prefill_start") / 10).floor() * 10 + 5)
        .group_by("b")
        .agg(pl.col("t_c").sum(), pl.col("t_ideal_c").sum())
        .sort("b")
    )
    assert list(bars.x) == per_bin["b"].to_list()
    np.testing.assert_allclose(
        bars.y, (1 - per_bin["t_c"] / per_bin["t_ideal_c"]).to_numpy(), rtol=1e-12
    )
    # Per prefill node: h* marks labelled with their lost reuse (two decimals below 1%).
    (hs,) = [t for t in fig.data if t.name == "h* per node"]
    per_node = (
        measured.group_by("prefill_node").agg(pl.col("t_c", "t_ideal_c").sum()).sort("prefill_node")
    )
    lost = (1 - per_node["t_c"] / per_node["t_ideal_c"]).to_list()
    assert list(hs.text) == [f"lost {v:.1%}" if v >= 0.01 else f"lost {v:.2%}" for v in lost]


def test_latency_cdfs_and_quantiles_match_the_requests(sim_run):
    fig = latency_distributions(sim_run.db, sim_run.run_id)
    done = _df(
        sim_run.db,
        f"SELECT t_first_token - t_arrival AS ttft, t_done - t_arrival AS e2e FROM requests "
        f"WHERE run_id = '{sim_run.run_id}' AND t_arrival >= {WARMUP_S} AND t_done IS NOT NULL",
    )
    stats = fig.layout.meta["stats"]["all"]
    s = sim_run.summary
    assert stats["requests"] == done.height == s["requests"]
    for metric in ("ttft", "e2e"):
        values = done[metric].to_numpy()
        assert stats[f"p50_{metric}_s"] == pytest.approx(np.percentile(values, 50), rel=1e-12)
        assert stats[f"p95_{metric}_s"] == pytest.approx(np.percentile(values, 95), rel=1e-12)
        assert stats[f"mean_{metric}_s"] == pytest.approx(values.mean(), rel=1e-12)
        assert stats[f"p95_{metric}_s"] == pytest.approx(s[f"p95_{metric}_s"], rel=1e-12)
        (cdf,) = [t for t in fig.data if t.meta["metric"] == metric]
        assert cdf.y[0] == 0 and cdf.y[-1] == 1
        # At each bin edge the CDF is the share of requests below it.
        for x, y in list(zip(cdf.x, cdf.y, strict=True))[1::7]:
            assert y == pytest.approx((values < x).mean(), abs=1.5 / values.size)


def test_latency_per_node_and_sampled_quantiles(sim_run, monkeypatch):
    per = latency_distributions(sim_run.db, sim_run.run_id, by="prefill_node")
    ttft = [t for t in per.data if t.meta["metric"] == "ttft"]
    nodes = _df(
        sim_run.db,
        "SELECT prefill_node::VARCHAR AS g, count(*) AS n FROM requests "
        f"WHERE run_id = '{sim_run.run_id}' "
        f"AND t_arrival >= {WARMUP_S} AND t_done IS NOT NULL GROUP BY 1 ORDER BY 1",
    )
    assert sorted((t.meta["group"], t.meta["requests"]) for t in ttft) == list(nodes.iter_rows())
    with pytest.raises(ValueError, match="by must be one of"):
        latency_distributions(sim_run.db, sim_run.run_id, by="node")
    # Above the exact-quantile limit the quantiles come from a deterministic hash sample.
    monkeypatch.setattr(latency_module, "EXACT_QUANTILE_ROWS", 200)
    a = latency_distributions(sim_run.db, sim_run.run_id)
    b = latency_distributions(sim_run.db, sim_run.run_id)
    assert "200-request hash sample" in a.layout.title.text
    assert a.layout.meta["stats"] == b.layout.meta["stats"]
    exact = per.layout.meta["stats"]
    assert a.layout.meta["stats"]["all"]["requests"] == sum(v["requests"] for v in exact.values())


def test_node_load_boxes_busy_shares_and_imbalance(sim_run):
    fig = node_load(sim_run.db, sim_run.run_id)
    waits = _df(
        sim_run.db,
        f"SELECT prefill_node AS n, t_prefill_start - t_arrival AS w FROM requests "
        f"WHERE run_id = '{sim_run.run_id}' AND t_arrival >= {WARMUP_S} "
        "AND t_prefill_start IS NOT NULL",
    )
    (box,) = [t for t in fig.data if t.type == "box"]
    for label, median, mean in zip(box.x, box.median, box.mean, strict=True):
        w = waits.filter(pl.col("n") == int(label.split()[1]))["w"].to_numpy()
        assert median == pytest.approx(np.median(w), rel=1e-12)
        assert mean == pytest.approx(w.mean(), rel=1e-12)
    means = [float(m) for m in box.mean]
    assert fig.layout.meta["imbalance"]["prefill_queue_wait"] == pytest.approx(
        max(means) / np.mean(means)
    )
    busy = _df(
        sim_run.db,
        "SELECT node_id, sum(duration_s) AS s FROM prefill_iterations "
        f"WHERE run_id = '{sim_run.run_id}' "
        f"AND t_start >= {WARMUP_S} GROUP BY 1 ORDER BY 1",
    )
    (pre,) = [t for t in fig.data if t.name == "prefill iterations"]
    np.testing.assert_allclose(pre.y, (busy["s"] / 300.0).to_numpy(), rtol=1e-12)


def _tick_labels(axis) -> list[str]:
    """The labels plotly draws for an axis with tick0/dtick/range and a d3 '.N%' format."""
    lo, hi = axis.range
    decimals = int(axis.tickformat[1:-1])
    k = math.ceil((lo - axis.tick0) / axis.dtick - 1e-9)
    ticks = []
    while (t := axis.tick0 + k * axis.dtick) <= hi + 1e-12:
        ticks.append(f"{100 * t:.{decimals}f}%")
        k += 1
    return ticks


@pytest.fixture(scope="module")
def high_hit_db(tmp_path_factory):
    """97% hit rates that lose about 0.1% of the ideal reuse, on three prefill nodes."""
    db = tmp_path_factory.mktemp("hit") / "hit.duckdb"
    rng = np.random.default_rng(0)
    n = 300
    t_arr = np.sort(rng.uniform(0, 300, n))
    t_in = rng.integers(20_000, 40_000, n)
    ideal = (t_in * rng.uniform(0.962, 0.975, n)).astype(int)
    t_c = ideal - (rng.random(n) < 0.3) * (ideal * 0.004).astype(int)
    with TelemetryWriter(db, run_id="hit", source="test", config={"duration_s": 300.0}) as w:
        w.add_nodes({"node_id": [0, 1, 2], "name": list("abc"), "hardware": ["x"] * 3,
                     "moe_top_k": [8] * 3, "moe_experts": [256] * 3})  # fmt: skip
        w.append(
            "requests",
            {
                "request_id": [f"r{i}" for i in range(n)], "program_id": ["p"] * n,
                "branch_id": ["root"] * n, "t_arrival": t_arr.tolist(),
                "prefill_node": (np.arange(n) % 3).tolist(), "decode_node": [2] * n,
                "t_in": t_in.tolist(), "t_c": t_c.tolist(), "t_fetch": [0] * n,
                "t_out": [10] * n, "t_prefill_start": (t_arr + 0.1).tolist(),
                "t_first_token": (t_arr + 0.2).tolist(), "t_done": (t_arr + 1).tolist(),
                "t_ideal_c": ideal.tolist(),
            },
        )  # fmt: skip
    return db


def test_lost_kv_axes_show_a_small_loss_with_distinct_ticks(high_hit_db):
    fig = lost_kv_reuse(high_hit_db)
    tot = fig.layout.meta["totals"]
    assert 0.96 < tot["h"] < tot["h_star"] < 0.98 and tot["lost"] < 0.002
    series = {
        "yaxis": [t.y for t in fig.data if t.name.startswith(("achieved", "ideal"))],
        "yaxis2": [t.y for t in fig.data if t.name in ("h per node", "h* per node")],
        "yaxis3": [t.y for t in fig.data if t.name.startswith("lost")],
    }
    for axis_name, values in series.items():
        axis = fig.layout[axis_name]
        labels = _tick_labels(axis)
        assert len(labels) >= 3 and len(set(labels)) == len(labels), (axis_name, labels)
        data = [v for ys in values for v in ys if v is not None]
        lo, hi = axis.range
        assert lo <= min(data) and max(data) <= hi
        if axis_name != "yaxis3":  # hit rates: the axis hugs the data, not 0–100%
            assert (max(data) - min(data)) / (hi - lo) > 0.4, (axis_name, axis.range)
    assert fig.layout.yaxis3.range[0] == 0.0  # lost reuse: bars from zero
    # Per node, h and h* are told apart: their gap is a visible share of the axis.
    h, h_star = (next(t.y for t in fig.data if t.name == n) for n in ("h per node", "h* per node"))
    lo, hi = fig.layout.yaxis2.range
    assert min(b - a for a, b in zip(h, h_star, strict=True)) / (hi - lo) > 0.05


def test_percent_axis_steps_and_decimals():
    wide = percent_axis([0.2, 0.9])
    assert wide["range"][0] == 0.0 and wide["tickformat"] == ".0%" and wide["dtick"] >= 0.1
    narrow = percent_axis([0.9671, 0.9686])
    assert narrow["tickformat"] == ".2%" and narrow["dtick"] < 0.001
    assert 0.96 < narrow["range"][0] < 0.9671 and 0.9686 < narrow["range"][1] < 0.97
    assert percent_axis([0.0003, 0.0012], zero=True)["range"][0] == 0.0
    assert percent_axis([], zero=True)["range"] == [0.0, 1.0]
    flat = percent_axis([0.5, 0.5])
    assert flat["range"][0] < 0.5 < flat["range"][1]
