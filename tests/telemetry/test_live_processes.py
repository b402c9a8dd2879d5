"""Reading a run while another process writes it; lock handoff; crash recovery (SPEC §3)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import pytest

from telemetry import TelemetryError, TelemetryReader, TelemetryWriter, live, recover, write_rows
from telemetry.live import run_dir
from telemetry.store import is_lock_error

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
pytestmark = pytest.mark.timeout(120)


def spawn(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )


def start_writer(db: Path, run_id: str, batches: int, rows: int) -> subprocess.Popen[str]:
    return spawn(str(HERE / "writer_proc.py"), str(db), run_id, str(batches), str(rows))


def expect(proc: subprocess.Popen[str], line: str) -> None:
    assert proc.stdout is not None
    got = proc.stdout.readline().strip()
    if got != line:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"expected {line!r} from subprocess, got {got!r}; stderr:\n{err}")


def step(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.write("\n")
    proc.stdin.flush()


def counts(r: TelemetryReader, run_id: str) -> tuple[int, int]:
    df = r.sql(
        "SELECT count(*) AS n, count(DISTINCT iter_id) AS d FROM decode_iterations WHERE run_id = ?",
        [run_id],
    )
    return df["n"].item(), df["d"].item()


def test_reader_sees_run_grow_then_exactly_the_final_rows(db):
    proc = start_writer(db, "stream", 4, 1000)
    r = TelemetryReader(db)
    seen = []
    for k in range(1, 5):
        expect(proc, f"flushed {k * 1000}")
        seen.append(counts(r, "stream"))
        assert r.runs()["live"].to_list() == [True]
        if k == 2:
            assert recover(db) == []  # the writer is alive: recover leaves its run alone
        step(proc)
    expect(proc, "closing")
    # Poll while the writer consolidates: never a duplicate, never a missing row.
    during = []
    while proc.poll() is None:
        during.append(counts(r, "stream"))
    assert proc.wait() == 0, proc.communicate()[1]
    assert seen == [(1000, 1000), (2000, 2000), (3000, 3000), (4000, 4000)]
    assert set(during) <= {(4000, 4000)}
    assert counts(r, "stream") == (4000, 4000)
    assert r.runs()["live"].to_list() == [False]
    assert not run_dir(db, "stream").exists()


def test_writer_waits_for_a_reader_holding_the_database(db):
    proc = start_writer(db, "held", 1, 500)
    expect(proc, "flushed 500")
    with TelemetryReader(db).connect() as con:
        step(proc)
        expect(proc, "closing")
        time.sleep(1.0)
        assert proc.poll() is None  # still retrying the lock
        assert run_dir(db, "held").exists()
        assert con.execute("SELECT count(*) FROM decode_iterations").fetchall() == [(500,)]
    expect(proc, "closed")
    assert proc.wait(timeout=30) == 0
    r = TelemetryReader(db)
    assert counts(r, "held") == (500, 500)
    assert r.runs()["live"].to_list() == [False]


def test_recover_finalizes_a_killed_writer(db):
    proc = start_writer(db, "crash", 3, 700)
    expect(proc, "flushed 700")
    step(proc)
    expect(proc, "flushed 1400")
    step(proc)
    expect(proc, "flushed 2100")
    proc.kill()
    proc.wait()
    r = TelemetryReader(db)
    assert r.runs()["live"].to_list() == [True]
    assert counts(r, "crash") == (2100, 2100)  # readable before recovery too
    assert recover(db) == ["crash"]
    assert counts(r, "crash") == (2100, 2100)
    assert r.runs()["live"].to_list() == [False]
    assert r.nodes("crash")["node_id"].to_list() == [0, 1, 2]
    assert not run_dir(db, "crash").exists()
    assert recover(db) == []
    with pytest.raises(TelemetryError, match="already exists"):
        TelemetryWriter(db, run_id="crash")


def test_duckdb_lock_errors_are_retried_then_reported(db):
    TelemetryWriter(db, run_id="a").close()
    holder = spawn(
        "-c",
        "import duckdb, sys; c = duckdb.connect(sys.argv[1]); print('held', flush=True); "
        "sys.stdin.readline()",
        str(db),
    )
    try:
        expect(holder, "held")
        with pytest.raises(duckdb.Error) as raw:
            duckdb.connect(str(db), read_only=True)
        assert isinstance(raw.value, duckdb.IOException) and is_lock_error(raw.value)
        assert not is_lock_error(duckdb.IOException("IO Error: Corrupt database: invalid block"))
        locked = r"stayed locked by another connection for 0.3 s \(DuckDB: .*lock"
        with pytest.raises(TelemetryError, match=locked):
            TelemetryReader(db, lock_timeout_s=0.3).runs()
        with pytest.raises(TelemetryError, match=locked):
            TelemetryWriter(db, run_id="b", lock_timeout_s=0.3)
        assert not run_dir(db, "b").exists()
        fit = {"node_id": [0], "phase": ["decode"], "fitted_at": [None], "coef": [[1.0]]}
        with pytest.raises(TelemetryError, match=locked):
            write_rows(db, "model_fits", {**fit, "samples": [1]}, "a", timeout_s=0.3)
    finally:
        step(holder)
        holder.wait(timeout=30)
    assert TelemetryReader(db).resolve_run(None) == "a"


def test_close_blocked_in_process_can_be_retried(db, rows, nodes):
    w = TelemetryWriter(db, run_id="retry", lock_timeout_s=0.3)
    w.add_nodes(nodes())
    w.append("kv_events", rows("kv_events", 10))
    r = TelemetryReader(db)
    with r.connect():
        with pytest.raises(
            TelemetryError, match=r"could not finalize run 'retry'.*segments stay in"
        ):
            w.close()
        assert not w.closed
    assert r.table("kv_events").height == 10  # from the segments, still live
    w.close()
    assert w.closed and r.table("kv_events").height == 10
    assert r.runs()["live"].to_list() == [False]


def test_readers_yield_to_a_writer_waiting_for_the_lock(db):
    TelemetryWriter(db, run_id="a").close()
    stale = live.live_root(db) / f"{live.WRITE_MARKER}999-dead"  # left by a killed writer
    stale.parent.mkdir(exist_ok=True)
    stale.touch()
    live.wait_for_writers(db, 5.0)
    assert not stale.exists()
    done = threading.Event()
    reader = threading.Thread(target=lambda: (TelemetryReader(db).runs(), done.set()))
    with live.write_intent(db):
        reader.start()
        assert not done.wait(0.3)  # holds off while a writer wants the file
    assert done.wait(10)
    reader.join()


def test_reader_nested_in_its_own_connection_does_not_wait_for_writers(db):
    TelemetryWriter(db, run_id="a").close()
    r = TelemetryReader(db)
    done = threading.Event()
    with r.connect(), live.write_intent(db):
        # This process holds the file, so a writer cannot get it before we finish anyway.
        nested = threading.Thread(target=lambda: (r.runs(), done.set()))
        nested.start()
        assert done.wait(10)
    nested.join()
