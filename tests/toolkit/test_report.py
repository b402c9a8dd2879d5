"""`pdlab report`: one self-contained HTML file with the run summary and every figure."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cluster.sim.runner import simulate
from cluster.sim.simulator import SimConfig
from toolkit.cli import app
from toolkit.plots import FIGURES
from toolkit.report import ReportError, build_report

# Small, but with switches, planner windows and evictions (as tests/toolkit/plots uses).
CONFIG = SimConfig(
    workload="cc",
    agents=20,
    duration_s=400.0,
    warmup_s=100.0,
    nodes=4,
    split="3P1D",
    window_s=100.0,
    cooldown_s=30.0,
    l1_tokens=200_000,
    l2_tokens=400_000,
    seed=0,
)
EXACT_KEYS = (
    "requests",
    "throughput_rps",
    "mean_ttft_s",
    "p50_ttft_s",
    "p95_ttft_s",
    "mean_e2e_s",
    "p50_e2e_s",
    "p95_e2e_s",
    "switches",
    "mean_switch_time_s",
    "final_split",
    "sim_seconds",
    "measured_seconds",
)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    db = tmp_path_factory.mktemp("report") / "sim.duckdb"
    summary = simulate(CONFIG, db)
    return db, summary


@pytest.fixture(scope="module")
def report(run):
    db, summary = run
    return build_report(db, summary["run_id"])


def test_report_holds_every_figure_and_plotly_once(report):
    page = report.html
    assert not report.failures
    assert list(report.titles) == list(FIGURES)
    for title in report.titles.values():
        assert f"<h2>{title}</h2>" in page.replace("&amp;", "&")
    assert page.count("plotly.js v") == 1  # the library's license header
    assert page.count("Plotly.newPlot(") == len(FIGURES)
    assert "<script src=" not in page and "cdn.plot.ly/plotly" not in page  # nothing fetched
    assert f"<h1>pdlab report · run {report.run_id}</h1>" in page


def test_summary_is_the_simulators_from_the_tables(run, report):
    _, sim = run
    s = report.summary
    for key in EXACT_KEYS:
        want = sim[key] if isinstance(sim[key], str) else pytest.approx(sim[key], rel=1e-9)
        assert s[key] == want, key
    # The tables hold finished requests only; the simulator also counted requests in flight.
    for key in ("kv_hit_rate", "ideal_kv_hit_rate"):
        assert s[key] == pytest.approx(sim[key], rel=0.05)
    assert s["lost_kv_reuse"] == pytest.approx(1 - s["kv_hit_rate"] / s["ideal_kv_hit_rate"])
    assert (s["initial_split"], s["nodes"], s["source"]) == ("3P1D", 4, "sim")


def test_cli_writes_the_file(run, tmp_path: Path):
    db, summary = run
    out = tmp_path / "r.html"
    res = CliRunner().invoke(
        app, ["report", str(db), "-o", str(out), "--figure", "latency", "--figure", "split"]
    )
    assert res.exit_code == 0, res.output
    assert f"run {summary['run_id']}, 2 figures" in res.output
    page = out.read_text(encoding="utf-8")
    assert page.count("Plotly.newPlot(") == 2 and "TTFT, TPOT and E2E latency distributions" in page


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.duckdb"], "does not exist"),
        (["{db}", "--run", "nope"], "unknown run 'nope'"),
        (["{db}", "--figure", "pie"], "unknown figure(s) ['pie']; choose from: split"),
        (["{db}", "-o", "{tmp}/no/such/dir/r.html"], "output folder"),
    ],
)
def test_cli_input_errors_exit_2(run, tmp_path: Path, args, message):
    db, _ = run
    argv = [a.format(db=db, tmp=tmp_path) for a in args]
    if "-o" not in argv:
        argv += ["-o", str(tmp_path / "r.html")]
    res = CliRunner().invoke(app, ["report", *argv])
    assert res.exit_code == 2
    assert message in res.output


def test_a_failing_figure_is_shown_and_exits_1(run, tmp_path: Path, monkeypatch):
    db, _ = run

    def broken(db, run_id=None):
        raise RuntimeError("boom")

    monkeypatch.setitem(FIGURES, "latency", broken)
    out = tmp_path / "r.html"
    res = CliRunner().invoke(app, ["report", str(db), "-o", str(out), "--figure", "latency"])
    assert res.exit_code == 1
    assert "figure latency failed: RuntimeError: boom" in res.output
    assert "figure failed: RuntimeError: boom" in out.read_text(encoding="utf-8")


def test_build_report_errors(tmp_path: Path):
    with pytest.raises(ReportError, match="no telemetry at"):
        build_report(tmp_path / "missing.duckdb")
    bad = tmp_path / "not-a-db.duckdb"
    bad.write_text("hello")
    with pytest.raises(ReportError, match="cannot read"):
        build_report(bad)
