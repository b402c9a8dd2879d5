"""The query half of every figure (`toolkit.queries`), checked on the simulated run's DuckDB
without plotly: each returns the numbers a direct computation gives, and on empty tables a
`missing` message instead of data."""

from __future__ import annotations

import math
import subprocess
import sys

import duckdb
import numpy as np
import pytest

from toolkit.queries import (
    count_tree_data,
    counts_data,
    eviction_data,
    fit_data,
    gain_threshold,
    latency_data,
    load_data,
    open_run,
    phi_data,
    planner_data,
    reuse_data,
    split_data,
)

WARMUP_S = 100.0


def _scalar(db, sql: str, params=()):
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql, list(params)).fetchone()[0]


def test_the_queries_import_no_plotly():
    code = (
        "import sys, toolkit.queries; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'plotly'); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_latency_and_reuse_match_the_run_summary(sim_run):
    s = sim_run.summary
    with open_run(sim_run.db) as run:
        lat = latency_data(run)
        per_node = latency_data(run, by="decode_node")
        reuse = reuse_data(run)
    assert lat.missing is None and lat.t0 == WARMUP_S and lat.sample_rows is None
    (row,) = lat.stats.iter_rows(named=True)
    assert row["n"] == s["requests"]
    assert row["ttft_mean"] == pytest.approx(s["mean_ttft_s"], rel=1e-12)
    assert row["e2e_q"][1] == pytest.approx(s["p95_e2e_s"], rel=1e-12)
    for metric in ("ttft", "e2e"):
        assert lat.hist.filter(lat.hist["metric"] == metric)["n"].sum() == s["requests"]
    assert per_node.stats["n"].sum() == s["requests"] and per_node.stats.height > 1
    h = _scalar(
        sim_run.db,
        "SELECT sum(t_c) / sum(t_in) FROM requests WHERE t_prefill_start IS NOT NULL "
        "AND t_arrival >= ?",
        [WARMUP_S],
    )
    assert reuse.totals["h"] == pytest.approx(h, rel=1e-12)
    assert reuse.per_t["n"].sum() == reuse.per_node["n"].sum() == reuse.totals["requests"]
    lost = reuse.per_t.drop_nulls("lost")
    assert (lost["lost"] == 1 - lost["h"] / lost["h_star"]).all()


def test_load_split_and_planner(sim_run):
    with open_run(sim_run.db) as run:
        load = load_data(run)
        split = split_data(run)
        planner = planner_data(run)
    busy = _scalar(
        sim_run.db,
        "SELECT sum(duration_s) FROM decode_iterations WHERE run_id = ? AND t_start >= ?",
        [sim_run.run_id, WARMUP_S],
    )
    got = load.busy.filter(load.busy["phase"] == "decode")["busy_s"].sum()
    assert got == pytest.approx(busy, rel=1e-12)
    assert load.span_s == pytest.approx(400.0 - WARMUP_S)
    means = load.waits["mean_s"].to_list()
    assert load.wait_imbalance == pytest.approx(max(means) / np.mean(means))
    final = split.counts.row(-1, named=True)
    assert f"{final['prefill']}P{final['decode']}D" == sim_run.summary["final_split"]
    assert split.timeline.switches.height >= sim_run.summary["switches"] > 0
    assert split.labels == {n: f"node-{n}" for n in range(4)}
    w = planner.windows
    assert w.height > 0 and w["chosen"].sum() >= 1
    for r in w.iter_rows(named=True):
        assert r["threshold"] == gain_threshold(r["std_gain"], r["slices"])
        assert r["threshold"] == pytest.approx(2 * r["std_gain"] / math.sqrt(r["slices"]))


def test_kv_queries_count_every_logged_row(sim_run):
    with open_run(sim_run.db) as run:
        ev = eviction_data(run)
        counts = counts_data(run, bins=40)
        tree = count_tree_data(run, max_blocks=10)
        phi = phi_data(run)
    evictions = _scalar(sim_run.db, "SELECT count(*) FROM evictions")
    assert ev.has_kv_events and ev.stats["n"].sum() == evictions
    assert set(ev.stats["tier"]) <= {"gpu", "host"}
    assert counts.nodes == [0, 1, 2, 3] and counts.blocks.shape == (4, len(counts.t))
    assert (counts.refs >= counts.blocks).all()  # each referenced block has count >= 1
    assert tree.missing is None and 1 <= len(tree.blocks) <= 10 and tree.nodes == [0, 1, 2, 3]
    assert all(c >= 0 for c in tree.counts.values()) and max(tree.counts.values()) > 0
    assert set(tree.phase) == set(tree.nodes)
    (shape,) = phi.shapes
    assert shape.nodes == [0, 1, 2, 3] and shape.num_experts > shape.top_k > 0
    assert sum(c for _, c in phi.batch_hist) == _scalar(
        sim_run.db, "SELECT count(*) FROM decode_iterations"
    )


def test_fit_data_predicts_every_valid_iteration(sim_run):
    with open_run(sim_run.db) as run:
        data = fit_data(run, "decode", sample=50)
    assert data.missing is None and data.fits
    fitted = sorted(data.fits)
    assert sum(data.counts.values()) == _scalar(
        sim_run.db,
        "SELECT count(*) FROM decode_iterations WHERE duration_s > 0 AND batch_size > 0 "
        "AND t_fwd > 0 AND node_id IN (SELECT unnest(?::INTEGER[]))",
        [fitted],
    )
    per_node = data.points.group_by("node_id").len()
    assert per_node["len"].max() <= 50
    assert (data.points["yhat"] > 0).all() and set(data.t_fwd) >= set(data.fits)
    # The binned relative error agrees with the sampled points' on the same node.
    node = next(iter(data.fits))
    pts = data.points.filter(data.points["node_id"] == node)
    rel = ((pts["y"] - pts["yhat"]) / pts["y"]).abs().mean()
    assert rel < 0.5


def test_empty_tables_give_missing_messages(empty_run):
    with open_run(empty_run.db) as run:
        results = {
            "latency": latency_data(run),
            "reuse": reuse_data(run),
            "load": load_data(run),
            "planner": planner_data(run),
            "eviction": eviction_data(run),
            "counts": counts_data(run),
            "count_tree": count_tree_data(run),
            "fit": fit_data(run, "prefill"),
        }
        split = split_data(run)
    for name, data in results.items():
        assert data.missing and data.missing.startswith("no "), name
    assert split.missing is None and set(split.timeline.final.values()) == {"unknown"}
