"""`pdlab serve` whose live segments are removed mid-run (issue 28's probe, end to end).

Before: health stayed "ok", the run was marked "finished" and requests were missing without
a word. Now the next flush fails the run: health says "error" with the reason, the server
logs it, the run is stored as failed, and the command exits non-zero.
"""

from __future__ import annotations

import time
from pathlib import Path

import duckdb
import httpx

from telemetry import live
from telemetry.schema import RUN_STATUS_TABLE
from toolkit.client import launch_server


def _segments(db: Path) -> list[Path]:
    root = live.live_root(db)
    return [p for p in root.glob("*/*/*.parquet") if p.parent.name not in live.WRITTEN_THROUGH]


def test_removed_live_segments_fail_the_run_visibly(tmp_path: Path) -> None:
    db = tmp_path / "live.duckdb"
    srv = launch_server("--nodes", "2", "--split", "1P1D", "--agents", "16", "--window", "60",
                        "--slices", "4", db=db, speed=60.0)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not _segments(db) and time.monotonic() < deadline:
            time.sleep(0.2)
        removed = _segments(db)
        assert removed, srv.log()[-2000:]
        for seg in removed:  # what the probe did: the run's segments gone mid-run
            seg.unlink()
        with httpx.Client(base_url=srv.url, timeout=5.0) as http:
            deadline = time.monotonic() + 20
            health = http.get("/v1/health").json()
            while health["status"] != "error" and time.monotonic() < deadline:
                time.sleep(0.2)
                health = http.get("/v1/health").json()
        assert health["status"] == "error" and "removed" in health["error"], health
        code = srv.stop(30)
    finally:
        srv.stop(5)
    log = srv.log()
    assert code == 1, log[-3000:]
    assert "the run failed" in log and "removed while the run was written" in log
    with duckdb.connect(str(db), read_only=True) as con:
        (status,) = con.execute(f"SELECT status FROM {RUN_STATUS_TABLE}").fetchone()
    assert status == "failed"
