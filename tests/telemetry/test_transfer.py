"""Parquet export and import of a run (SPEC §3)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from telemetry import (
    SCHEMA_VERSION,
    TABLES,
    TelemetryError,
    TelemetryWriter,
    export_run,
    import_run,
    open_reader,
)

DATA_TABLES = [t for t in TABLES if t not in ("runs", "nodes")]


def write_run(db: Path, run_id: str, rows, nodes, close: bool = True) -> TelemetryWriter:
    w = TelemetryWriter(db, run_id=run_id, source="sglang", config={"nodes": 3})
    w.add_nodes(nodes())
    for k, table in enumerate(DATA_TABLES):
        w.append(table, rows(table, 11, seed=k))
    if close:
        w.close()
    else:
        w.flush()
    return w


def frames(db: Path, run_id: str) -> dict[str, pl.DataFrame]:
    r = open_reader(db)
    return {t: r.table(t, run_id=run_id).drop("run_id") for t in TABLES}


def total_rows(db: Path) -> dict[str, int]:
    with open_reader(db).connect() as con:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in TABLES}


def test_export_import_round_trip(tmp_path, rows, nodes):
    src = tmp_path / "src.duckdb"
    write_run(src, "r1", rows, nodes)
    out = export_run(src, "r1", tmp_path / "export")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["schema_version"] == SCHEMA_VERSION and manifest["run_id"] == "r1"
    assert manifest["tables"] == {
        t: 1 if t == "runs" else 3 if t == "nodes" else 11 for t in TABLES
    }
    assert sorted(p.name for p in out.glob("*.parquet")) == sorted(f"{t}.parquet" for t in TABLES)

    dst = tmp_path / "dst.duckdb"
    assert import_run(dst, out) == "r1"
    expected = frames(src, "r1")
    got = frames(dst, "r1")
    for table in TABLES:
        assert got[table].equals(expected[table]), table

    assert import_run(src, out, run_id="r1-copy") == "r1-copy"  # same DB, new id
    copy = frames(src, "r1-copy")
    for table in TABLES:
        assert copy[table].equals(expected[table]), table


def test_import_refuses_an_existing_run_and_changes_nothing(tmp_path, rows, nodes):
    db = tmp_path / "a.duckdb"
    write_run(db, "r1", rows, nodes)
    out = export_run(db, None, tmp_path / "export")
    before = total_rows(db)
    with pytest.raises(TelemetryError, match=r"run 'r1' already exists .* under another id"):
        import_run(db, out)
    assert total_rows(db) == before
    live = write_run(db, "busy", rows, nodes, close=False)  # a live run's id is taken too
    with pytest.raises(TelemetryError, match="run 'busy' already exists"):
        import_run(db, out, run_id="busy")
    live.close()


def test_import_validates_every_table(tmp_path, rows, nodes):
    db = tmp_path / "a.duckdb"
    write_run(db, "r1", rows, nodes)
    out = export_run(db, "r1", tmp_path / "export")
    target = tmp_path / "b.duckdb"
    table = pq.read_table(out / "decode_iterations.parquet")
    bad = table.set_column(
        table.schema.get_field_index("duration_s"),
        "duration_s",
        pl.Series([0.1] * 4 + [-2.0] + [0.1] * 6).to_arrow(),
    )
    pq.write_table(bad, out / "decode_iterations.parquet")
    with pytest.raises(
        TelemetryError, match=r"decode_iterations row 4, column duration_s: -2\.0 is not > 0"
    ):
        import_run(target, out)
    assert not target.exists() or total_rows(target) == dict.fromkeys(TABLES, 0)
    (out / "decode_iterations.parquet").unlink()
    (out / "evictions.parquet").rename(out / "eviction.parquet")
    with pytest.raises(TelemetryError, match="unknown table file"):
        import_run(target, out)


def test_export_of_a_live_run_and_bad_inputs(tmp_path, rows, nodes):
    db = tmp_path / "a.duckdb"
    w = write_run(db, "live", rows, nodes, close=False)
    out = export_run(db, "live", tmp_path / "export")
    assert json.loads((out / "manifest.json").read_text())["tables"]["kv_events"] == 11
    with pytest.raises(TelemetryError, match="is not empty"):
        export_run(db, "live", out)
    with pytest.raises(TelemetryError, match="unknown run 'nope'"):
        export_run(db, "nope", tmp_path / "other")
    w.close()
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "schema_version": 99}))
    with pytest.raises(TelemetryError, match="schema version 99; this pdlab reads up to"):
        import_run(tmp_path / "b.duckdb", out)
    (out / "manifest.json").unlink()
    with pytest.raises(TelemetryError, match=r"manifest\.json is missing"):
        import_run(tmp_path / "b.duckdb", out)
