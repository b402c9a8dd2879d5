"""`pdlab export DB --run RUN --format parquet|csv -o DIR` (toolkit/cli/export.py over
telemetry.transfer): every table's rows of one run, one file per table, and a manifest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from cluster.sim.runner import simulate
from cluster.sim.simulator import SimConfig
from telemetry import TABLES, TelemetryWriter, import_run, open_reader
from toolkit.cli import app
from toolkit.fit.synth import synth_logs

SMALL = SimConfig(workload="cc", agents=6, duration_s=150.0, warmup_s=30.0, nodes=2,
                  split="1P1D", seed=0)  # fmt: skip


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """A database with a simulated run (many tables) and a synthetic one beside it."""
    db = tmp_path_factory.mktemp("export") / "two.duckdb"
    sim_run = simulate(SMALL, db)["run_id"]
    other = synth_logs(db, nodes=1, prefill_iters=40, decode_iters=40, run_id="other")
    return db, sim_run, other


def counts(db: Path, run_id: str) -> dict[str, int]:
    with open_reader(db).connect() as con:
        return {
            t: con.execute(f"SELECT count(*) FROM {t} WHERE run_id = ?", [run_id]).fetchone()[0]
            for t in TABLES
        }


def test_parquet_export_holds_every_table_of_the_run_and_imports_back(
    two_runs: tuple[Path, str, str], tmp_path: Path
) -> None:
    db, run, _ = two_runs
    out = tmp_path / "exp"
    res = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", "export", str(db), "--run", run,
         "--format", "parquet", "-o", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    expected = counts(db, run)
    assert sum(1 for n in expected.values() if n) >= 8  # requests, iterations, kv events, ...
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["run_id"] == run and manifest["file_format"] == "parquet"
    assert manifest["source"] == "sim" and manifest["status"] == "finished"
    assert manifest["tables"] == expected  # the other run's rows are not in it
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["manifest.json", *(f"{t}.parquet" for t in TABLES)]
    )
    assert f"{sum(expected.values()):,} rows" in res.stdout
    requests = pl.read_parquet(out / "requests.parquet")
    assert requests.height == expected["requests"] and set(requests["run_id"]) == {run}
    dst = tmp_path / "copy.duckdb"
    assert import_run(dst, out) == run
    assert counts(dst, run) == expected
    a = open_reader(db).table("decode_iterations", run_id=run).sort("node_id", "t_start")
    b = open_reader(dst).table("decode_iterations", run_id=run).sort("node_id", "t_start")
    assert a.equals(b)


def test_csv_export_has_a_header_and_the_same_rows(
    two_runs: tuple[Path, str, str], tmp_path: Path
) -> None:
    db, run, _ = two_runs
    out = tmp_path / "csv"
    res = CliRunner().invoke(app, ["export", str(db), "--run", run, "--format", "csv",
                                   "-o", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    expected = counts(db, run)
    for table in ("requests", "prefill_iterations", "nodes", "runs"):
        got = pl.read_csv(out / f"{table}.csv", infer_schema_length=0)
        assert got.height == expected[table], table
        assert got.columns == [c.name for c in TABLES[table]], table
    ours = open_reader(db).table("requests", run_id=run).sort("request_id")
    theirs = pl.read_csv(out / "requests.csv").sort("request_id")
    assert theirs["t_done"].to_list() == pytest.approx(ours["t_done"].to_list())
    # a CSV export is not importable, and says why
    with pytest.raises(Exception, match="only a Parquet export can be imported"):
        import_run(tmp_path / "x.duckdb", out)


def test_a_live_run_exports_what_it_has_written(tmp_path: Path) -> None:
    db = tmp_path / "live.duckdb"
    w = TelemetryWriter(db, run_id="running", source="sglang")
    w.add_nodes({"node_id": [0], "name": ["n0"], "hardware": ["h"], "moe_top_k": [0],
                 "moe_experts": [0]})  # fmt: skip
    synth = tmp_path / "s.duckdb"
    synth_logs(synth, nodes=1, prefill_iters=30, decode_iters=30, run_id="x")
    rows = open_reader(synth).table("decode_iterations", run_id="x").drop("run_id")
    w.append("decode_iterations", {"run_id": ["running"] * rows.height, **rows.to_dict()})
    w.flush()
    try:
        res = CliRunner().invoke(app, ["export", str(db), "-o", str(tmp_path / "e")])
        assert res.exit_code == 0, res.output
        manifest = json.loads((tmp_path / "e" / "manifest.json").read_text())
        assert manifest["status"] == "running" and manifest["tables"]["decode_iterations"] == 30
    finally:
        w.close()


def test_bad_input_is_one_line_and_writes_nothing(
    two_runs: tuple[Path, str, str], tmp_path: Path
) -> None:
    db, run, other = two_runs
    runner = CliRunner()
    res = runner.invoke(app, ["export", str(db), "-o", str(tmp_path / "a")])
    assert res.exit_code == 2 and f"holds 2 runs; choose one of: {run}, {other}" in res.output
    res = runner.invoke(app, ["export", str(db), "--run", "nope", "-o", str(tmp_path / "a")])
    assert res.exit_code == 2 and "unknown run 'nope'" in res.output
    res = runner.invoke(app, ["export", str(db), "--run", run, "--format", "xlsx",
                              "-o", str(tmp_path / "a")])  # fmt: skip
    assert res.exit_code == 2 and "--format must be one of parquet, csv" in res.output
    assert not (tmp_path / "a").exists()
    res = runner.invoke(
        app, ["export", str(tmp_path / "missing.duckdb"), "-o", str(tmp_path / "a")]
    )
    assert res.exit_code == 2 and "no telemetry at" in res.output
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    res = runner.invoke(app, ["export", str(db), "--run", other, "-o", str(full)])
    assert res.exit_code == 2 and "not empty" in res.output
    assert [p.name for p in full.iterdir()] == ["keep.txt"]
    res = runner.invoke(app, ["export", str(db), "--run", other, "-o", str(full), "--force"])
    assert res.exit_code == 0 and (full / "keep.txt").read_text() == "mine"
