"""Crash safety of `pdlab simulate`: a real `kill -9`, then fit, recover, fit again.

Rows reach the live Parquet segments within a few wall seconds (the simulator's buffer and
the writer both flush on a time bound), a killed run is marked unfinished wherever it is
read, and `pdlab recover DB` folds it into the database. A failed simulation leaves no empty
run behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster.core import ConfigError, MemorySink
from cluster.sim.buffer import BufferedSink
from cluster.sim.runner import simulate
from cluster.sim.simulator import SimConfig
from telemetry import TelemetryReader, TelemetryWriter, live, open_reader
from telemetry.check import precheck

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.timeout(300)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "toolkit.cli", *args],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=120,
    )  # fmt: skip


def _recover(db: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = "import typer; from toolkit.cli.recover import recover_command as c; typer.run(c)"
    return subprocess.run(
        [sys.executable, "-c", code, str(db)], capture_output=True, text=True, env=env, timeout=120
    )


def _counts(db: Path) -> dict[str, int]:
    r = TelemetryReader(db)
    return {
        t: int(r.sql(f"SELECT count(*) AS n FROM {t}")["n"].item())
        for t in ("prefill_iterations", "decode_iterations", "requests")
    }


def test_kill_9_keeps_recent_rows_marks_the_run_and_recover_folds_it_in(tmp_path: Path) -> None:
    db = tmp_path / "crash.duckdb"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # A long run that writes few prefill rows per wall second (~300/s here): with
    # 50,000-row buffers none of them reached disk before the process died.
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolkit.cli", "simulate", "--nodes", "2", "--split", "1P1D",
         "--agents", "8", "--duration", "36000", "--warmup", "0", "--planner", "static",
         "--db", str(db)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None and not live.live_run_ids(db):
            time.sleep(0.2)  # until the run is registered (imports and setup take a while)
        registered = time.monotonic()
        segs: dict[str, list[Path]] = {}
        while time.monotonic() < registered + 30 and proc.poll() is None:
            runs = live.live_run_ids(db)
            segs = live.segments(db, runs[0]) if runs else {}
            if "prefill_iterations" in segs and "requests" in segs:
                break
            time.sleep(0.5)
        alive = proc.poll() is None
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert alive, proc.stderr.read() if proc.stderr else ""
    # Flushed on a time bound: rows reach the live segments within seconds, not once
    # 50,000 of a table have piled up (minutes of this run).
    assert "prefill_iterations" in segs and "requests" in segs, "no rows flushed within 30 s"

    reader = open_reader(db)
    runs = reader.runs()
    assert runs["status"].to_list() == ["crashed"] and runs["live"].to_list() == [True]
    before = _counts(db)
    assert all(n > 0 for n in before.values()), before
    note = precheck(db, None)  # what `pdlab report` prints first
    assert note is not None and "never finished" in note
    fit = _cli("fit", str(db), "--no-write", "--bootstrap", "0", cwd=tmp_path)
    assert fit.returncode == 0, fit.stderr
    assert "never finished" in fit.stderr and "pdlab recover" in fit.stderr

    rec = _recover(db)
    assert rec.returncode == 0, rec.stderr
    assert "recovered run" in rec.stdout and "marked 'recovered'" in rec.stdout
    assert _counts(db) == before  # every flushed row, now in the database file
    assert not live.run_dir(db, runs["run_id"][0]).exists()
    state = TelemetryReader(db).runs()
    assert state["status"].to_list() == ["recovered"] and state["live"].to_list() == [False]
    assert "rows recovered" in state["status_detail"][0]
    fit = _cli("fit", str(db), "--no-write", "--bootstrap", "0", cwd=tmp_path)
    assert fit.returncode == 0 and "recovered after a crash" in fit.stderr
    again = _recover(db)
    assert again.returncode == 0 and "nothing to recover" in again.stdout


def test_buffer_hands_rows_over_on_a_time_bound() -> None:
    sink = MemorySink()
    buf = BufferedSink(sink, batch_rows=50_000, flush_interval_s=0.2)
    for i in range(100):
        buf.row("requests", i=i)
    assert not sink.tables  # below batch_rows and within the time bound: still buffered
    time.sleep(0.25)
    for i in range(100, 200):  # the clock is read once per 64 rows
        buf.row("requests", i=i)
    assert len(sink.rows("requests")) >= 100


def test_failed_setup_leaves_no_run_and_a_failed_run_is_marked(tmp_path: Path) -> None:
    db = tmp_path / "f.duckdb"
    bad = SimConfig(nodes=2, split="1P1D", agents=2, duration_s=30, warmup_s=0, eviction="nope")
    with pytest.raises(ConfigError, match="unknown eviction"):
        simulate(bad, db)
    assert not db.exists() and not live.live_root(db).exists()

    policy = tmp_path / "late.py"
    policy.write_text(
        "from cluster.policies import SchedulingPolicy\n\n"
        "class Late(SchedulingPolicy):\n"
        "    def priority(self, pcb, now):\n"
        "        if now > 20.0:\n"
        "            raise ValueError('bad value in user hook')\n"
        "        return now\n"
    )
    cfg = SimConfig(
        nodes=2, split="1P1D", agents=4, duration_s=120, warmup_s=0, planner="static",
        scheduling=f"{policy}:Late",
    )  # fmt: skip
    with pytest.raises(ConfigError, match="hook priority at t="):
        simulate(cfg, db, run_id="late")
    runs = open_reader(db).runs()
    assert runs["run_id"].to_list() == ["late"] and runs["status"].to_list() == ["failed"]
    assert "bad value in user hook" in runs["status_detail"][0]
    assert _counts(db)["decode_iterations"] > 0  # the rows simulated before t=20 are kept

    # A writer that fails before writing any data row leaves nothing behind.
    with pytest.raises(RuntimeError), TelemetryWriter(db, run_id="empty") as w:
        w.add_nodes(
            [{"node_id": 0, "name": "n0", "hardware": "H200", "moe_top_k": 8, "moe_experts": 256}]
        )
        raise RuntimeError("setup failed")
    assert open_reader(db).runs()["run_id"].to_list() == ["late"]
    assert (
        TelemetryReader(db)
        .sql("SELECT count(*) AS n FROM nodes WHERE run_id = 'empty'")["n"]
        .item()
        == 0
    )
