"""`pdlab runs list|show|rm` and `pdlab import ... --replace` on real DuckDB files."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
from typer.testing import CliRunner

from telemetry import TelemetryWriter
from telemetry.schema import FINALIZED_TABLE, RUN_STATUS_TABLE, TABLES, Column
from toolkit.cli import app

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
runner = CliRunner()


def _value(col: Column, i: int) -> Any:
    if col.allowed is not None:
        return col.allowed[i % len(col.allowed)]
    if col.node_ref:
        return 0
    return {
        "VARCHAR": f"{col.name}-{i}",
        "JSON": '{"k": 1}',
        "INTEGER": i + 1,
        "BIGINT": i + 1,
        "DOUBLE": float(i + 1),
        "BOOLEAN": bool(i % 2),
        "TIMESTAMP": datetime(2026, 1, 1),
        "DOUBLE[]": [1.0],
    }[col.sql]


def _write_run(db: Path, run_id: str, n: int) -> None:
    """A finished run with `n` rows in every SPEC §3 table (one node)."""
    with TelemetryWriter(db, run_id=run_id, config={"who": run_id}) as w:
        w.add_nodes(
            [{"node_id": 0, "name": "n0", "hardware": "x", "moe_top_k": 0, "moe_experts": 0}]
        )
        for table, cols in TABLES.items():
            if table in ("runs", "nodes"):
                continue
            rows = {c.name: [_value(c, i) for i in range(n)] for c in cols if c.name != "run_id"}
            w.append(table, rows)


def _counts(db: Path, run_id: str) -> dict[str, int]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        out = {}
        for t in (*TABLES, RUN_STATUS_TABLE, FINALIZED_TABLE):
            out[t] = con.execute(f"SELECT count(*) FROM {t} WHERE run_id = ?", [run_id]).fetchone()[
                0
            ]
        return out
    finally:
        con.close()


def test_rm_removes_every_tables_rows_of_that_run_and_nothing_else(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    _write_run(db, "a", 3)
    _write_run(db, "b", 2)
    before_b = _counts(db, "b")
    assert all(n > 0 for n in _counts(db, "a").values())

    listed = runner.invoke(app, ["runs", "list", str(db), "--json"])
    assert listed.exit_code == 0, listed.output
    docs = {d["id"]: d for d in json.loads(listed.stdout)}
    assert set(docs) == {"a", "b"}
    for d in docs.values():
        assert {"id", "kind", "started", "finished", "rows"} <= set(d)
        assert d["kind"] == "sim" and d["finished"] is not None and d["status"] == "finished"
    # rows: every table's rows of the run (runs and nodes rows included)
    assert docs["a"]["rows"] == 1 + 1 + 3 * (len(TABLES) - 2)

    rm = runner.invoke(app, ["runs", "rm", str(db), "a"])
    assert rm.exit_code == 0, rm.output
    assert "removed run a" in rm.stdout
    assert all(n == 0 for n in _counts(db, "a").values())
    assert _counts(db, "b") == before_b
    again = runner.invoke(app, ["runs", "list", str(db), "--json"])
    assert [d["id"] for d in json.loads(again.stdout)] == ["b"]

    # an unknown run: one-line error, nothing removed (all or none)
    bad = runner.invoke(app, ["runs", "rm", str(db), "b", "nope"])
    assert bad.exit_code == 2 and "unknown run(s) 'nope'" in bad.output
    assert _counts(db, "b") == before_b
    shown = runner.invoke(app, ["runs", "show", str(db), "b", "--json"])
    assert shown.exit_code == 0 and json.loads(shown.stdout)["config"] == {"who": "b"}


def test_import_replace_swaps_a_run_in_one_transaction(tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    src = str(FIXTURES / "real_runs/rtx4090_llama31_8b_vllm")
    first = runner.invoke(app, ["import", "vllm-bench", src, "--db", str(db), "--json"])
    assert first.exit_code == 0, first.output
    _write_run(db, "other", 1)
    dup = runner.invoke(app, ["import", "vllm-bench", src, "--db", str(db)])
    assert dup.exit_code == 2 and "--replace" in dup.output
    rid = "vllm-rtx4090_llama31_8b_vllm"
    again = runner.invoke(app, ["import", "vllm-bench", src, "--db", str(db), "--replace"])
    assert again.exit_code == 0, again.output
    counts = _counts(db, rid)
    assert counts["requests"] == 300 and counts["runs"] == 1 and counts["nodes"] == 1
    assert _counts(db, "other")["requests"] == 1
    listed = json.loads(runner.invoke(app, ["runs", "list", str(db), "--json"]).stdout)
    assert sorted(d["id"] for d in listed) == sorted([rid, "other"])
    started = next(d for d in listed if d["id"] == rid)["started"]
    assert started.startswith("2026-08-20") and datetime.fromisoformat(started) < datetime.now(
        UTC
    ).replace(tzinfo=None)
