"""The `programs` table (paper 003 §3.1: JCT and preemptions per program): a simulated run
writes one row per finished program, consistent with its summary; bad rows are rejected."""

from __future__ import annotations

import pytest

from cluster.sim.runner import simulate
from cluster.sim.simulator import SimConfig
from telemetry import TelemetryError, TelemetryWriter, open_reader


def test_simulated_run_writes_programs_consistent_with_summary(tmp_path):
    db = tmp_path / "t.duckdb"
    cfg = SimConfig(
        workload="cc",
        nodes=1,
        split="collocated",
        agents=6,
        duration_s=400,
        warmup_s=0,
        planner="static",
        host_kv=False,
        l1_tokens=400_000,
        retention="ttl",
        scheduling="plas",
        seed=2,
    )
    summary = simulate(cfg, db)
    progs = open_reader(db).table("programs", run_id=summary["run_id"])
    assert progs.height == summary["programs_finished"] > 0
    assert (progs["jct_s"] - (progs["t_done"] - progs["t_arrival"])).abs().max() < 1e-9
    assert progs["jct_s"].mean() == pytest.approx(summary["mean_jct_s"])
    assert progs["preemptions"].sum() == summary["preemptions"]
    assert (progs["attained_service_s"] <= progs["jct_s"] + 1e-9).all()
    assert set(progs["workload"]) == {"cc"}


def test_programs_rows_are_validated(tmp_path):
    row = {
        "program_id": ["p0"],
        "workload": ["cc"],
        "t_arrival": [1.0],
        "t_done": [5.0],
        "jct_s": [-4.0],
        "turns": [3],
        "preemptions": [0],
        "attained_service_s": [2.0],
    }
    with TelemetryWriter(tmp_path / "v.duckdb", run_id="r1", source="sim") as w:
        with pytest.raises(
            TelemetryError,
            match=r"programs row 0, column jct_s: -4.0 is not >= 0 \(jct_s must be nonnegative\)",
        ):
            w.emit("programs", row)
        row["jct_s"] = [4.0]
        w.emit("programs", row)
    got = open_reader(tmp_path / "v.duckdb").table("programs", run_id="r1")
    assert got.height == 1 and got["jct_s"][0] == 4.0
