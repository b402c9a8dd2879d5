"""What a run holds picks the report's figures (toolkit.queries.content), and the queries of
the figures a request-only import gets: the recorded running/waiting series next to the one
rebuilt from request times, and TPOT's distribution. Real DuckDB, the committed copy of a
real vLLM run (the bundled cluster/data/files/real_runs) and the session's simulated PD run."""

from __future__ import annotations

import csv
import html
from pathlib import Path

import numpy as np
import pytest

from cluster.data import BUNDLED
from toolkit.importers import read_vllm_bench, write_runs
from toolkit.plots import FIGURES
from toolkit.queries import open_run
from toolkit.queries.content import ORDER, RunContent, run_content, select_figures
from toolkit.queries.latency import latency_data
from toolkit.queries.series import queue_series
from toolkit.report import build_report

REAL = BUNDLED / "real_runs" / "rtx4090_llama31_8b_vllm"


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("content") / "real.duckdb"
    write_runs(db, [read_vllm_bench(REAL, run_id="real")])
    return db


def _requests(db: Path) -> dict[str, np.ndarray]:
    with open_run(db) as run:
        df = run.df("SELECT * FROM requests WHERE run_id = ?", [run.run_id])
    return {c: df[c].to_numpy().astype(float) for c in ("t_arrival", "t_prefill_start",
            "t_first_token", "t_done", "t_out")}  # fmt: skip


def test_the_order_names_every_figure():
    assert set(ORDER) == set(FIGURES) and len(ORDER) == len(FIGURES)


def test_a_request_only_import_gets_its_latencies_and_queue(imported):
    with open_run(imported) as run:
        c = run_content(run)
    assert (c.requests, c.passes, c.nodes, c.moe, c.pd) == (300, 0, 1, False, False)
    assert c.recorded_series and c.importer == "vllm-bench"
    picked = select_figures(c)
    assert picked.names == ["latency", "queue"]
    note = picked.note()
    for said in ("pass timeline", "iteration-time fits", "PD split", "dense model", "KV reuse"):
        assert said in note
    report = build_report(imported)
    assert list(report.titles) == ["latency", "queue"] and not report.failures
    page = report.html
    assert "no prefill iterations logged" not in page and "no planner windows" not in page
    assert html.escape(note) in page
    # t_c was not recorded by the benchmark: the hit rate is unknown, not 0; no split known.
    assert report.summary["kv_hit_rate"] is None and report.summary["final_split"] is None


def test_the_recorded_series_is_the_files_and_the_rebuilt_one_counts_requests(imported):
    with open_run(imported) as run:
        q = queue_series(run)
    rows = list(csv.DictReader((REAL / "timeseries.csv").open()))
    for metric in ("running", "waiting", "kv_cache_pct"):
        got = q.recorded.filter(q.recorded["metric"] == metric)
        assert got["t"].to_list() == [float(r["t"]) for r in rows]
        assert got["value"].to_list() == [float(r[metric]) for r in rows]
    assert "timeseries.csv" in q.recorded_from
    r = _requests(imported)
    for t, waiting, running in q.derived.select("t", "waiting", "running").iter_rows():
        assert waiting == ((r["t_arrival"] <= t) & (t < r["t_prefill_start"])).sum()
        assert running == ((r["t_prefill_start"] <= t) & (t < r["t_done"])).sum()
    # Both describe one engine: at the recorded ticks, the counts agree to a few requests
    # (the logger's last step in a tick vs the tick's end; its clock within a tick of ours).
    at = {round(t, 6): v for t, v in q.derived.select("t", "running").iter_rows()}
    rec = q.recorded.filter(q.recorded["metric"] == "running")
    diffs = [abs(at[t] - v) for t, v in rec.select("t", "value").iter_rows() if t in at]
    assert len(diffs) > 150 and np.mean(diffs) < 5


def test_tpot_distribution_is_vllms_definition(imported):
    with open_run(imported) as run:
        lat = latency_data(run)
    r = _requests(imported)
    ok = r["t_out"] > 1
    tpot = (r["t_done"][ok] - r["t_first_token"][ok]) / (r["t_out"][ok] - 1)
    (row,) = lat.stats.iter_rows(named=True)
    assert row["n_tpot"] == ok.sum() and row["n"] == 300
    assert row["tpot_mean"] == pytest.approx(tpot.mean(), rel=1e-12)
    assert row["tpot_q"][0] == pytest.approx(np.percentile(tpot, 50), rel=1e-12)
    assert lat.hist.filter(lat.hist["metric"] == "tpot")["n"].sum() == ok.sum()


def test_a_simulated_pd_run_with_moe_gets_every_figure(sim_run):
    with open_run(sim_run.db) as run:
        c = run_content(run)
    assert c.pd and c.moe and c.passes > 0 and c.planner_windows > 0 and c.switches > 0
    picked = select_figures(c)
    assert picked.names == list(ORDER) and picked.note() is None


def _content(**kw) -> RunContent:
    base = dict(
        run_id="r", source="sim", importer=None, nodes=2, requests=10, scheduled=10,
        prefill_passes=5, decode_passes=5, phases=frozenset({"collocated"}), switches=0,
        planner_windows=0, moe=False, cached_tokens=True, evictions=0, branch_counts=0,
        recorded_series=False,
    )  # fmt: skip
    return RunContent(**(base | kw))


@pytest.mark.parametrize(
    ("change", "shown", "hidden", "said"),
    [
        ({}, {"timeline", "decode_fit", "load"}, {"phi", "split", "planner"}, "dense model"),
        ({"moe": True}, {"phi"}, set(), None),
        ({"moe": True, "decode_passes": 0}, {"prefill_fit"}, {"phi", "decode_fit"}, "MoE model"),
        ({"phases": frozenset({"prefill", "decode"})}, {"split"}, {"planner"}, "static split"),
        ({"planner_windows": 3, "switches": 1}, {"split", "planner"}, set(), None),
        ({"evictions": 4, "branch_counts": 2}, {"eviction", "counts", "count_tree"}, set(), None),
        ({"prefill_passes": 0, "decode_passes": 0}, {"load"}, {"timeline"}, "request-only"),
        ({"prefill_passes": 0, "decode_passes": 0, "nodes": 1}, set(), {"load"}, "one engine"),
        (
            {"requests": 0, "scheduled": 0, "cached_tokens": False},
            set(),
            {"latency"},
            "no finished",
        ),
    ],
)
def test_selection_follows_the_content(change, shown, hidden, said):
    picked = select_figures(_content(**change))
    assert shown <= set(picked.names) and not hidden & set(picked.names)
    assert picked.names == [n for n in ORDER if n in picked.names]
    if said:
        assert said in picked.note()


def test_a_run_without_schedule_times_shows_requests_in_flight(tmp_path):
    """vLLM's result file (`vllm bench serve`) has client-side times only: no schedule."""
    from datetime import UTC, datetime

    from toolkit.importers import BenchRun
    from toolkit.plots.queue import queue_over_time

    run = BenchRun("client", datetime(2026, 1, 1, tzinfo=UTC), "vllm-bench-serve", {}, ["e"], "x")
    for i in range(10):
        run.add_request(
            request_id=f"r{i}", program_id=f"r{i}", branch_id=f"r{i}", t_arrival=float(i),
            prefill_node=0, decode_node=0, t_in=10, t_c=0, t_fetch=0, t_out=5,
            t_first_token=i + 0.5, t_done=i + 3.0,
        )  # fmt: skip
    db = tmp_path / "c.duckdb"
    write_runs(db, [run])
    with open_run(db) as r:
        q = queue_series(r)
        assert select_figures(run_content(r)).names == ["latency", "queue"]
    assert q.recorded.is_empty() and set(q.derived.columns) == {"t", "in_flight"}
    # arrivals every second, each in flight for 3 s: 3 at a time once the run is going
    assert q.derived.filter((q.derived["t"] >= 3) & (q.derived["t"] < 9))[
        "in_flight"
    ].unique().to_list() == [3]
    fig = queue_over_time(db)
    assert fig.layout.meta["pdlab_title"] == "Requests in flight over time"
    assert "running and waiting not told apart" in fig.layout.title.text
