"""Writer -> live segments -> DuckDB -> polars readers, in one process (SPEC §3)."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta, timezone

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from telemetry import (
    SCHEMA_VERSION,
    TABLES,
    TelemetryError,
    TelemetryReader,
    TelemetryWriter,
    open_reader,
)
from telemetry.live import live_root, run_dir

DATA_TABLES = [t for t in TABLES if t not in ("runs", "nodes")]


def test_every_table_round_trips_exactly(db, rows, nodes):
    started = datetime(2025, 3, 4, 5, 6, 7, 890123)
    expected = {t: rows(t, 37, seed=k) for k, t in enumerate(DATA_TABLES)}
    with TelemetryWriter(db, run_id="rt", config={"b": [1, 2]}, started_at=started) as w:
        w.add_nodes(nodes())
        for table, data in expected.items():
            w.append(table, data)
    r = open_reader(db)
    runs = r.runs()
    assert runs.to_dicts() == [
        {
            "run_id": "rt",
            "started_at": started,
            "source": "sim",
            "config": '{"b": [1, 2]}',
            "live": False,
            "status": "finished",
            "status_detail": None,
        }
    ]
    assert r.nodes("rt").drop("run_id").to_dicts() == nodes()
    for table, data in expected.items():
        got = r.table(table, run_id="rt")
        assert got.columns == [c.name for c in TABLES[table]]
        assert got["run_id"].unique().to_list() == ["rt"]
        assert got.drop("run_id").to_dict(as_series=False) == data, table
    assert not run_dir(db, "rt").exists()


def test_rows_become_visible_when_flushed(db, rows, nodes):
    w = TelemetryWriter(db, run_id="live", segment_rows=50, flush_interval_s=3600)
    w.add_nodes(nodes())
    r = open_reader(db)
    assert r.runs()["live"].to_list() == [True]
    w.append("decode_iterations", rows("decode_iterations", 30))
    assert r.table("decode_iterations").height == 0  # buffered only
    assert w.buffered_rows("decode_iterations") == 30
    w.append("decode_iterations", rows("decode_iterations", 30, seed=1))  # 60 >= 50: auto-flush
    assert w.buffered_rows() == 0
    assert r.table("decode_iterations").height == 60
    w.append("kv_events", rows("kv_events", 5))
    w.flush()
    assert r.sql("SELECT count(*) AS n FROM kv_events")["n"].item() == 5
    w.close()
    assert r.table("decode_iterations").height == 60
    assert r.runs()["live"].to_list() == [False]


def test_time_based_flush_happens_on_append(db, rows, nodes):
    with TelemetryWriter(db, run_id="t", flush_interval_s=0.0) as w:
        w.add_nodes(nodes())
        w.append("branch_counts", rows("branch_counts", 3))
        assert w.buffered_rows() == 0
        assert open_reader(db).table("branch_counts").height == 3


def test_input_forms_are_equivalent(db, rows, nodes):
    data = rows("router_decisions", 12)
    table = pa.table(data)
    forms = {
        "dict": data,
        "arrow": table,
        "batch": table.to_batches()[0],
        "polars": pl.DataFrame(data),
        "rows": table.to_pylist(),
        "numpy": {
            k: np.array(
                v, dtype=object if k in ("request_id", "policy", "predicted_ttft_s") else None
            )
            for k, v in data.items()
        },
        "series": {k: pl.Series(v) for k, v in data.items()},
    }
    with TelemetryWriter(db, run_id="forms") as w:
        w.add_nodes(nodes())
        for form in forms.values():
            w.emit("router_decisions", form)
    got = open_reader(db).table("router_decisions", run_id="forms").drop("run_id")
    assert got.height == 12 * len(forms)
    for k in range(len(forms)):
        assert got.slice(12 * k, 12).to_dict(as_series=False) == data


def test_missing_nullable_columns_are_null_and_timestamps_normalized(db, nodes):
    with TelemetryWriter(
        db, run_id="n", started_at=datetime(2025, 1, 1, 12, tzinfo=timezone(timedelta(hours=2)))
    ) as w:
        w.add_nodes(nodes())
        w.append(
            "kv_events",
            {"t": [0.5], "node_id": [1], "tier": ["host"], "kind": ["cleared"], "num_tokens": [0]},
        )
        w.append(
            "model_fits",
            {
                "node_id": [1],
                "phase": ["decode"],
                "fitted_at": [datetime(2025, 1, 1, tzinfo=UTC)],
                "coef": [[1, 2, 3]],
                "samples": [9],
            },
        )
    r = open_reader(db)
    assert r.runs()["started_at"].to_list() == [datetime(2025, 1, 1, 10)]
    kv = r.table("kv_events").to_dicts()[0]
    assert kv["block_hash"] is None and kv["parent_hash"] is None
    fit = r.table("model_fits").to_dicts()[0]
    assert (
        fit["coef"] == [1.0, 2.0, 3.0]
        and fit["mape"] is None
        and fit["fitted_at"] == datetime(2025, 1, 1)
    )


def test_writer_refuses_existing_run_and_use_after_close(db, nodes):
    w = TelemetryWriter(db, run_id="dup")
    with pytest.raises(TelemetryError, match="'dup' already has live segments"):
        TelemetryWriter(db, run_id="dup")
    w.close()
    with pytest.raises(TelemetryError, match="run 'dup' already exists"):
        TelemetryWriter(db, run_id="dup")
    assert not run_dir(db, "dup").exists()
    with pytest.raises(TelemetryError, match="is closed"):
        w.append("kv_events", {})
    with pytest.raises(TelemetryError, match="runs row is written by TelemetryWriter"):
        TelemetryWriter(db, run_id="other").append("runs", {})
    with pytest.raises(TelemetryError, match="invalid run id"):
        TelemetryWriter(db, run_id="../escape")
    with pytest.raises(TelemetryError, match="config must be JSON-serializable"):
        TelemetryWriter(db, run_id="cfg", config={"f": object()})
    assert not run_dir(db, "cfg").exists()


def test_generated_run_ids_are_unique_and_resolve(db):
    with TelemetryWriter(db) as a:
        pass
    r = open_reader(db)
    assert a.run_id.startswith("run-") and r.resolve_run(None) == a.run_id
    with TelemetryWriter(db) as b:
        pass
    assert a.run_id != b.run_id
    with pytest.raises(TelemetryError, match=f"2 runs; choose one of: .*{b.run_id}"):
        r.resolve_run(None)
    with pytest.raises(TelemetryError, match=f"unknown run 'nope'.*{a.run_id}"):
        r.resolve_run("nope")
    with pytest.raises(TelemetryError, match="unknown run 'nope'"):
        r.table("kv_events", run_id="nope")
    with pytest.raises(TelemetryError, match="unknown telemetry table 'kv'"):
        r.table("kv")
    with pytest.raises(
        TelemetryError, match=r"unknown column.*bogus; columns are: run_id, t, node_id"
    ):
        r.table("kv_events", columns=["t", "bogus"])


def test_table_filters_columns_and_where(db, rows, nodes):
    with TelemetryWriter(db, run_id="f") as w:
        w.add_nodes(nodes())
        w.append("evictions", rows("evictions", 40))
    r = open_reader(db)
    got = r.table("evictions", run_id="f", columns=["node_id", "tier"], where="tier = 'gpu'")
    assert got.columns == ["node_id", "tier"]
    assert got.height == sum(t == "gpu" for t in rows("evictions", 40)["tier"]) > 0


def test_context_manager_finalizes_valid_rows_on_exception(db, rows, nodes):
    with pytest.raises(RuntimeError, match="boom"), TelemetryWriter(db, run_id="x") as w:
        w.add_nodes(nodes())
        w.append("planner_windows", rows("planner_windows", 10))
        with pytest.raises(TelemetryError):
            w.append("planner_windows", {"t": [-1.0]})
        raise RuntimeError("boom")
    r = open_reader(db)
    assert r.table("planner_windows").height == 10
    assert r.runs()["live"].to_list() == [False]


def test_schema_version_mismatch_is_refused(db):
    TelemetryWriter(db, run_id="v").close()
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE pdlab_meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(
        TelemetryError, match=f"schema version 99; this pdlab writes version {SCHEMA_VERSION}"
    ):
        TelemetryWriter(db, run_id="w")
    assert not run_dir(db, "w").exists()
    with pytest.raises(TelemetryError, match="schema version 99; this pdlab reads up to"):
        open_reader(db).runs()
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE pdlab_meta SET value = '0' WHERE key = 'schema_version'")
    assert open_reader(db).resolve_run(None) == "v"  # older versions stay readable
    with pytest.raises(TelemetryError, match="schema version 0"):
        TelemetryWriter(db, run_id="w")


def test_reader_without_database_reads_live_segments(tmp_path, rows, nodes):
    src = tmp_path / "a.duckdb"
    w = TelemetryWriter(src, run_id="orphan", source="live-sim")
    w.add_nodes(nodes())
    w.append("requests", rows("requests", 8))
    w.flush()
    other = tmp_path / "b.duckdb"  # a DB file that does not exist, with live segments beside it
    shutil.copytree(live_root(src), live_root(other))
    r = open_reader(other)
    runs = r.runs()
    assert runs["run_id"].to_list() == ["orphan"] and runs["live"].to_list() == [True]
    assert runs["source"].to_list() == ["live-sim"]
    assert r.nodes("orphan").height == 3
    assert r.table("requests").drop("run_id").to_dict(as_series=False) == rows("requests", 8)
    assert r.table("kv_events").height == 0
    w.close()
    with pytest.raises(TelemetryError, match="no telemetry at"):
        open_reader(tmp_path / "nothing.duckdb")


def test_connect_gives_views_for_heavy_sql(db, rows, nodes):
    with TelemetryWriter(db, run_id="c") as w:
        w.add_nodes(nodes())
        w.append("prefill_iterations", rows("prefill_iterations", 100))
    r = TelemetryReader(db)
    with r.connect() as con:
        n, total = con.execute(
            "SELECT count(*), sum(t_uc) FROM prefill_iterations WHERE run_id = 'c'"
        ).fetchall()[0]
    assert n == 100 and total == sum(rows("prefill_iterations", 100)["t_uc"])
