"""Live segments removed while a run is written: the loss is reported, never a "finished" run.

The probe (issue 28) removed a serving run's `.live/` segments mid-run: health stayed "ok",
the run ended "finished" and 363 of 3,082 requests were missing without a word. Now the
writer refuses to recreate a removed run directory, checks each table's first and last
segment on every flush and counts every segment's rows at close: a loss raises
`TelemetryError`, and the run is stored as failed with what was lost.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pytest

from telemetry import TelemetryError, TelemetryWriter, live
from telemetry.schema import RUN_STATUS_TABLE

NODES = {"node_id": [0], "name": ["n0"], "hardware": ["cpu"], "moe_top_k": [0], "moe_experts": [0]}


def _requests(first: int, n: int) -> dict[str, list[object]]:
    ids = [f"r{i}" for i in range(first, first + n)]
    return {
        "request_id": ids,
        "program_id": ids,
        "branch_id": ids,
        "t_arrival": [float(i) for i in range(n)],
        "prefill_node": [0] * n,
        "decode_node": [0] * n,
        "t_in": [10] * n,
        "t_c": [0] * n,
        "t_fetch": [0] * n,
        "t_out": [5] * n,
        "t_first_token": [i + 0.5 for i in range(n)],
        "t_done": [i + 1.0 for i in range(n)],
    }


def _status(db: Path, run_id: str) -> tuple[str, str]:
    with duckdb.connect(str(db), read_only=True) as con:
        row = con.execute(
            f"SELECT status, detail FROM {RUN_STATUS_TABLE} WHERE run_id = ?", [run_id]
        ).fetchone()
        assert row is not None
        return row[0], row[1]


def _stored_requests(db: Path, run_id: str) -> int:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT count(*) FROM requests WHERE run_id = ?", [run_id]).fetchone()[0]


def test_removed_segments_fail_the_next_flush_and_the_run(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    w = TelemetryWriter(db, run_id="lost", flush_interval_s=3600)
    w.add_nodes(NODES)
    w.append("requests", _requests(0, 30))
    w.flush()
    for seg in (w.live_dir / "requests").glob("*.parquet"):
        seg.unlink()  # what `rm db.live/lost/requests/*.parquet` does mid-run
    w.append("requests", _requests(30, 20))
    with pytest.raises(TelemetryError, match="removed while the run was written"):
        w.flush()
    with pytest.raises(TelemetryError, match="removed while the run was written"):
        w.close()
    status, detail = _status(db, "lost")
    assert status == "failed" and "removed" in detail
    assert _stored_requests(db, "lost") == 20  # what was left is kept
    assert not live.run_dir(db, "lost").exists()


def test_a_removed_middle_segment_is_counted_at_close(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    w = TelemetryWriter(db, run_id="mid", flush_interval_s=3600)
    w.add_nodes(NODES)
    for k in range(3):
        w.append("requests", _requests(10 * k, 10))
        w.flush()
    (w.live_dir / "requests" / "00000001.parquet").unlink()  # first and last still there
    w.flush()  # the cheap check does not look at every segment
    with pytest.raises(TelemetryError, match="requests 10 of 30"):
        w.close()
    assert _status(db, "mid")[0] == "failed"
    assert _stored_requests(db, "mid") == 20


def test_a_removed_run_directory_is_not_recreated(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    w = TelemetryWriter(db, run_id="gone", flush_interval_s=3600)
    w.add_nodes(NODES)
    w.append("requests", _requests(0, 5))
    w.flush()
    shutil.rmtree(live.run_dir(db, "gone"))
    w.append("requests", _requests(5, 5))
    with pytest.raises(TelemetryError, match=r"is gone|removed"):
        w.flush()
    assert not live.run_dir(db, "gone").exists()
    with pytest.raises(TelemetryError):
        w.close()
    assert _status(db, "gone")[0] == "failed"


def test_an_intact_run_still_finishes(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    with TelemetryWriter(db, run_id="ok", flush_interval_s=3600) as w:
        w.add_nodes(NODES)
        for k in range(3):
            w.append("requests", _requests(10 * k, 10))
            w.flush()
    assert _status(db, "ok")[0] == "finished" and _stored_requests(db, "ok") == 30
