"""`pdlab lab`'s defaults (toolkit/cli/lab.py): the live run is added to the main job's
database, the simulated cluster keeps a bounded lag (adaptive pace, cluster/sim/paced.py),
and a real SIGTERM stops JupyterLab and the server at once, printing what is consolidated."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer

from cluster.sim.paced import PaceConfig, PacedSimulation
from cluster.sim.simulator import SimConfig
from telemetry import open_reader
from toolkit.cli import app
from toolkit.cli.lab import LAB_SHAPE, MAIN_DB
from toolkit.client import free_port
from toolkit.fit.synth import synth_logs

ROOT = Path(__file__).resolve().parents[2]


def test_the_lab_adds_its_run_to_the_main_job_s_database_by_default() -> None:
    lab = typer.main.get_command(app).commands["lab"]  # type: ignore[attr-defined]
    defaults = {p.name: p.default for p in lab.params}
    assert str(defaults["db"]) == MAIN_DB == "pdlab.duckdb"
    assert defaults["max_lag"] > 0  # adaptive pace
    assert LAB_SHAPE["sim"] == (4, "2P2D", 32)


def _lag_over(pace: PaceConfig, wall_s: float) -> tuple[list[float], dict[str, Any]]:
    cfg = SimConfig(workload="cc", nodes=9, split="4P5D", agents=126, duration_s=86_400,
                    warmup_s=0)  # fmt: skip
    engines = PacedSimulation(cfg, None, pace)
    engines.start()
    lags = []
    try:
        deadline = time.monotonic() + wall_s
        while time.monotonic() < deadline:
            time.sleep(0.25)
            assert engines.control_plane is not None
            with engines.control_plane.lock:
                lags.append(engines.lag_s)
                health = engines.health_details()
    finally:
        engines.stop()
    return lags, health


def test_an_adaptive_pace_keeps_the_lag_bounded_where_a_fixed_one_falls_behind() -> None:
    # 9 nodes and 126 agents at 2,000x: no machine keeps that pace.
    fixed, f_health = _lag_over(PaceConfig(speed=2_000.0), 5.0)
    adaptive, a_health = _lag_over(PaceConfig(speed=2_000.0, max_lag_wall_s=0.2), 5.0)
    assert f_health["pace"] == "fixed" and a_health["pace"] == "adaptive"
    assert fixed[-1] > 2_000.0  # behind by more than a wall second's worth, and growing
    bound = 2_000.0 * 0.2  # speed x max_lag_wall_s simulated seconds
    assert max(adaptive) <= bound + 1e-6, max(adaptive)
    kept = a_health["speed_kept"]  # what the simulator managed: far below the asked speed
    assert kept is not None and 0 < kept < 2_000.0


def test_bad_max_lag_is_one_line() -> None:
    from typer.testing import CliRunner

    res = CliRunner().invoke(app, ["serve", "--max-lag", "-1", "--port", "0"])
    assert res.exit_code == 2 and "--max-lag must be >= 0 wall seconds, got -1.0" in res.output


@pytest.mark.slow
def test_sigterm_stops_the_lab_at_once_and_says_what_it_consolidates(tmp_path: Path) -> None:
    """A real `pdlab lab` (default simulated cluster, JupyterLab) given SIGTERM: both stop,
    the run is consolidated into the database beside the main job's run, and the output
    says what was consolidated."""
    db, nbdir, log = tmp_path / "pdlab.duckdb", tmp_path / "notebooks", tmp_path / "lab.log"
    nbdir.mkdir()
    synth_logs(db, nodes=1, prefill_iters=40, decode_iters=40, run_id="main-job")
    port, lab_port = free_port(), free_port()
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "toolkit.cli", "lab", "--notebook-dir", str(nbdir),
             "--port", str(port), "--lab-port", str(lab_port), "--lab-token", "lt",
             "--token", "t", "--db", str(db), "--no-browser"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp_path,
            env=env,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while "pdlab lab: JupyterLab" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        health = httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=10).json()
        assert health["pace"] == "adaptive" and health["db"] == str(db)
        while httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=10).json()["time"] < 60:
            assert time.monotonic() < deadline
            time.sleep(0.5)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(180) == 0, log.read_text()[-3000:]
        stopped_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    run = health["run_id"]
    assert "pdlab lab: stopping JupyterLab and the server" in text
    assert f"consolidating run {run}: " in text and " rows (" in text
    assert f"consolidated run {run} in " in text and "pdlab lab: stopped" in text
    runs = open_reader(db).runs()
    assert runs["run_id"].to_list() == ["main-job", run]
    assert not runs["live"].to_list()[1] and runs["status"].to_list()[1] == "finished"
    print(f"SIGTERM to exit: {stopped_s:.1f} s")  # reported, not asserted (a loaded machine)
