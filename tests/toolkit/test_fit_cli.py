"""`pdlab fit`, `pdlab synth-logs` and `pdlab bench` on the command line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from toolkit.cli import app
from toolkit.fit.bench import DECODE_COEF, PREFILL_COEF, RUN_ID, write_bench_db
from toolkit.fit.run import fit_run

runner = CliRunner()


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "synth.duckdb"
    res = runner.invoke(
        app, ["synth-logs", str(path), "--nodes", "3", "--iterations", "1500", "--json"]
    )
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    assert info["prefill_iterations"] == 4500 and info["run_id"].startswith("synth-")
    return path


def test_fit_json_has_the_documented_shape(db: Path) -> None:
    res = runner.invoke(app, ["fit", str(db), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)  # exactly one JSON object on stdout
    assert out["run_id"].startswith("synth-")
    assert [n["node_id"] for n in out["nodes"]] == [0, 1, 2]
    for node in out["nodes"]:
        pre, dec = node["prefill"], node["decode"]
        assert len(pre["coef"]) == 4 and len(dec["coef"]) == 3
        assert len(pre["ci"]) == 4 and all(lo <= hi for lo, hi in pre["ci"])
        assert 0 < pre["mape"] < 0.05 and 0 < dec["mape"] < 0.05
        assert pre["samples"] + pre["samples_test"] == 1500
        assert "message" not in pre and "message" not in dec
        # Coefficients are seconds: c0 ~ 4 ms, d0 ~ 12 ms.
        assert pre["coef"][0] == pytest.approx(4e-3, rel=0.05)
        assert dec["coef"][0] == pytest.approx(1.2e-2, rel=0.05)
    assert out["model_fits_written"] == 6


def test_fit_table_and_node_filter(db: Path) -> None:
    res = runner.invoke(
        app, ["fit", str(db), "--node", "1", "--holdout", "0.3", "--no-write", "--wide"]
    )
    assert res.exit_code == 0, res.output
    assert "iteration-time fits of run synth-" in res.stdout
    assert "c0 = " in res.stdout and "d2 = " in res.stdout
    assert "rows written" not in res.stdout


def test_fit_table_is_compact_at_80_columns(db: Path) -> None:
    res = runner.invoke(app, ["fit", str(db), "--no-write"], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    # One line per node and phase (3 nodes): before, every coefficient wrapped onto its own
    # lines (~14 lines per node).
    rows = [line for line in lines if re.match(r"\s+\d+\s+(prefill|decode)\s", line)]
    assert len(rows) == 6 and len(lines) < 16
    assert all("e-" in row for row in rows)  # coefficients in scientific notation


def test_subprocess_stdout_is_pure_json(db: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", "fit", str(db), "--json", "--bootstrap", "20"],
        capture_output=True,
        text=True,
        check=True,
    )
    out = json.loads(proc.stdout)
    assert len(out["nodes"]) == 3


def test_refit_replaces_model_fits_rows(db: Path) -> None:
    for _ in range(2):
        assert runner.invoke(app, ["fit", str(db), "--json"]).exit_code == 0
    con = duckdb.connect(str(db), read_only=True)
    count, groups = con.execute(
        "SELECT count(*), count(DISTINCT (node_id, phase)) FROM model_fits"
    ).fetchone()
    con.close()
    assert count == groups == 6


def test_a_node_that_cannot_be_fitted_gets_a_message_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "few.duckdb"
    res = runner.invoke(app, ["synth-logs", str(path), "--nodes", "2", "--iterations", "6"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["fit", str(path), "--json"])
    # Nothing at all could be fitted: the entries say why, and the exit code says so too.
    assert res.exit_code == 1, res.output
    assert "error: no model could be fitted" in res.stderr
    for node in json.loads(res.stdout)["nodes"]:
        for phase in ("prefill", "decode"):
            entry = node[phase]
            assert entry["coef"] is None
            assert entry["message"].startswith(f"node {node['node_id']} {phase}: only ")
    table = runner.invoke(app, ["fit", str(path)])
    assert table.exit_code == 1 and "not fitted" in table.stdout and "need at least" in table.stdout


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["fit", "/nonexistent/x.duckdb"], "does not exist"),
        (["fit", "{db}", "--run", "nope"], "no run 'nope'"),
        (["fit", "{db}", "--node", "17"], "not in run"),
        (["fit", "{db}", "--holdout", "1.0"], "holdout must be a fraction"),
        (["bench", "--suite", "nope"], "unknown bench suite"),
    ],
)
def test_input_errors_exit_2_without_traceback(db: Path, args: list[str], expected: str) -> None:
    res = runner.invoke(app, [a.format(db=db) for a in args])
    assert res.exit_code == 2
    assert expected in res.stderr
    assert "Traceback" not in res.output and res.stdout == ""


def test_several_runs_without_run_is_an_error_listing_them(tmp_path: Path) -> None:
    path = tmp_path / "two.duckdb"
    ids = []
    for seed in (1, 2):
        res = runner.invoke(
            app, ["synth-logs", str(path), "--iterations", "50", "--seed", str(seed), "--json"]
        )
        ids.append(json.loads(res.stdout)["run_id"])
    res = runner.invoke(app, ["fit", str(path)])
    assert res.exit_code == 2
    assert "holds 2 runs" in res.stderr and ids[0] in res.stderr and ids[1] in res.stderr
    res = runner.invoke(app, ["fit", str(path), "--run", ids[1], "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["run_id"] == ids[1]


def test_bench_database_is_fitted_accurately(tmp_path: Path) -> None:
    """The benchmark's data (Arrow-inserted, 8 nodes) fits to the coefficients it encodes."""
    path = tmp_path / "bench.duckdb"
    write_bench_db(path, 40_000)
    fit = fit_run(path, RUN_ID, bootstrap=0)
    assert len(fit.nodes) == 8
    for node in fit.nodes:
        for f, truth in ((node.prefill, PREFILL_COEF), (node.decode, DECODE_COEF)):
            assert f.ok and f.samples + f.samples_test == 2500
            assert all(abs(c / t - 1) < 0.05 for c, t in zip(f.coef, truth, strict=True))
