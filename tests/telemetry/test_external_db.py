"""Databases written by external engines: plain SPEC §3 DDL, no pdlab bookkeeping tables."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import duckdb
import pytest

from telemetry import TelemetryError, TelemetryWriter, open_reader, write_rows

# What an engine might create by hand: a few tables, one of them (requests) from before
# the t_ideal_c column existed; no pdlab_meta, no pdlab_live_finalized.
EXTERNAL_DDL = """
CREATE TABLE runs (run_id VARCHAR, started_at TIMESTAMP, source VARCHAR, config JSON);
CREATE TABLE nodes (run_id VARCHAR, node_id INTEGER, name VARCHAR, hardware VARCHAR,
                    moe_top_k INTEGER, moe_experts INTEGER);
CREATE TABLE prefill_iterations (run_id VARCHAR, node_id INTEGER, iter_id BIGINT,
    t_start DOUBLE, duration_s DOUBLE, num_reqs INTEGER, t_uc BIGINT, attn_pairs DOUBLE,
    t_rst BIGINT, t_c BIGINT);
CREATE TABLE requests (run_id VARCHAR, request_id VARCHAR, program_id VARCHAR,
    branch_id VARCHAR, t_arrival DOUBLE, prefill_node INTEGER, decode_node INTEGER,
    t_in BIGINT, t_c BIGINT, t_fetch BIGINT, t_out BIGINT, t_prefill_start DOUBLE,
    t_first_token DOUBLE, t_done DOUBLE);
INSERT INTO runs VALUES ('sg1', TIMESTAMP '2025-05-01 10:00:00', 'sglang', '{"tp": 8}');
INSERT INTO nodes VALUES ('sg1', 0, 'p0', 'H200', 8, 256), ('sg1', 1, 'd0', 'H200', 8, 256);
INSERT INTO prefill_iterations
    SELECT 'sg1', 0, i, i * 0.1, 0.05 + i * 0.001, 2, 1000 + i, 5e5, 0, 4096
    FROM range(100) t(i);
INSERT INTO requests VALUES ('sg1', 'q1', 'p1', 'b1', 0.0, 0, 1, 900, 100, 0, 50, 0.01, 0.2, 1.5);
"""

FIT = {
    "node_id": [0, 0],
    "phase": ["prefill", "decode"],
    "fitted_at": [datetime(2025, 5, 2), datetime(2025, 5, 2)],
    "coef": [[0.01, 1e-5, 1e-9, 2e-6], [0.02, 0.003, 1e-4]],
    "samples": [100, 80],
    "mape": [0.031, None],
}


@pytest.fixture
def external(tmp_path: Path) -> Path:
    db = tmp_path / "engine.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute(EXTERNAL_DDL)
    return db


def tables_in(db: Path) -> set[str]:
    with duckdb.connect(str(db), read_only=True) as con:
        return {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}


def test_external_database_is_readable(external):
    r = open_reader(external)
    assert r.resolve_run(None) == "sg1"
    assert r.runs().select("run_id", "source", "live").to_dicts() == [
        {"run_id": "sg1", "source": "sglang", "live": False}
    ]
    it = r.table("prefill_iterations", run_id="sg1")
    assert it.height == 100 and it["t_uc"].sum() == sum(1000 + i for i in range(100))
    req = r.table("requests").to_dicts()[0]
    assert req["t_ideal_c"] is None and req["t_first_token"] == 0.2  # column added since
    kv = r.table("kv_events")  # table absent in the DB: an empty view with every column
    assert kv.height == 0 and kv.columns[:3] == ["run_id", "t", "node_id"]
    assert r.nodes("sg1")["name"].to_list() == ["p0", "d0"]


def test_write_rows_model_fits_on_external_database(external):
    assert write_rows(external, "model_fits", FIT, "sg1") == 2
    assert "model_fits" in tables_in(external)
    assert "pdlab_meta" not in tables_in(external)  # no pdlab bookkeeping forced on the engine
    fits = open_reader(external).table("model_fits", run_id="sg1")
    assert fits["coef"].to_list() == FIT["coef"] and fits["mape"].to_list() == FIT["mape"]


def test_write_rows_rejects_bad_rows_and_unknown_runs(external):
    write_rows(external, "model_fits", FIT, "sg1")
    bad = {**FIT, "phase": ["prefill", "collocated"]}
    with pytest.raises(
        TelemetryError,
        match=r"model_fits row 1, column phase: 'collocated' is not allowed \(allowed: prefill, decode\)",
    ):
        write_rows(external, "model_fits", bad, "sg1")
    with pytest.raises(TelemetryError, match=r"unknown run 'sg2' .*; runs: sg1"):
        write_rows(external, "model_fits", FIT, "sg2")
    with pytest.raises(
        TelemetryError, match=r"router_decisions row 0, column node_id: 7 is not allowed"
    ):
        write_rows(
            external,
            "router_decisions",
            {
                "t": [1.0],
                "request_id": ["q1"],
                "node_id": [7],
                "policy": ["rr"],
                "cached_tokens": [0],
                "fetch_tokens": [0],
            },
            "sg1",
        )
    with pytest.raises(TelemetryError, match="run 'sg1' already exists"):
        write_rows(external, "runs", {"started_at": [datetime(2025, 1, 1)], "source": ["x"]}, "sg1")
    with pytest.raises(TelemetryError, match="nodes row 0, column node_id: 1 is already a node"):
        write_rows(
            external,
            "nodes",
            {
                "node_id": [1],
                "name": ["x"],
                "hardware": ["h"],
                "moe_top_k": [0],
                "moe_experts": [0],
            },
            "sg1",
        )
    assert (
        open_reader(external).table("model_fits").height == 2
    )  # the rejected batches left no rows
    assert open_reader(external).table("nodes").height == 2


def test_writer_adopts_an_external_database(external, rows, nodes):
    with TelemetryWriter(external, run_id="sim1") as w:
        w.add_nodes(nodes())
        w.append("requests", rows("requests", 6))
        w.append("kv_events", rows("kv_events", 4))
    assert {"pdlab_meta", "pdlab_live_finalized", "kv_events"} <= tables_in(external)
    r = open_reader(external)
    assert r.runs()["run_id"].to_list() == ["sg1", "sim1"]
    got = r.table("requests", run_id="sim1").drop("run_id").to_dict(as_series=False)
    assert got == rows("requests", 6)
    assert r.table("requests", run_id="sg1").height == 1
