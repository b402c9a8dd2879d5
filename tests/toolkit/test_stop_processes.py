"""Every process `pdlab serve` and `pdlab lab` start is stopped by them (real signals).

Each test starts the command with torch engines (real `pdlab engine` processes), lists
every process below it with psutil while it serves (for `lab`: the server, its engines,
JupyterLab and two kernels started through JupyterLab's REST API), sends one signal and
checks that all of them are gone and that the run was consolidated into the DB (no live
segments, requests kept). Ctrl-C (SIGINT) is covered by test_serve_torch.py and the browser
test; here SIGTERM and SIGHUP of `serve`, SIGTERM of `lab` (SIGHUP takes the same handler),
and a `kill -9` of `pdlab lab`, after which
Linux's parent-death signal and the `--parent-pid` watches of server and engines still stop
everything; and a server a notebook kernel launched stops when the kernel is killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from telemetry import open_reader
from toolkit.client import free_port

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--engines", "torch", "--nodes", "2", "--split", "1P1D", "--agents", "2"]


def _start(args: list[str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(cwd / "runtime")}
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "toolkit.cli", *args],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd, env=env,
        )  # fmt: skip


def _tree(pid: int) -> list[int]:
    return [p.pid for p in psutil.Process(pid).children(recursive=True)]


def _served(url: str) -> bool:
    try:
        return httpx.get(f"{url}/v1/cluster", timeout=5).json()["requests_completed"] > 0
    except (httpx.HTTPError, KeyError, ValueError):
        return False


@pytest.fixture
def kill_leftovers() -> Iterator[list[int]]:
    """Pids a failing test must not leave running."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).kill()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["TERM", "HUP"])
def test_a_signal_to_serve_stops_its_engines_and_closes_the_run(
    sig: int, tmp_path: Path, kill_leftovers: list[int], procs: Any
) -> None:
    port, db, log = free_port(), tmp_path / "live.duckdb", tmp_path / "serve.log"
    proc = _start(["serve", *SMALL, "--port", str(port), "--db", str(db), "--token", "t"],
                  log, tmp_path)  # fmt: skip
    kill_leftovers.append(proc.pid)
    url = f"http://127.0.0.1:{port}"
    procs.wait_for(lambda: proc.poll() is not None or _served(url), 300, "requests served")
    assert proc.poll() is None, log.read_text()[-3000:]
    below = _tree(proc.pid)
    kill_leftovers.extend(below)
    assert len(below) == 2  # the engines
    proc.send_signal(sig)
    assert proc.wait(90) == 0, log.read_text()[-3000:]
    assert procs.gone(below), f"survivors of {signal.Signals(sig).name}: {below}"
    runs = open_reader(db).runs()
    assert runs.height == 1 and not runs["live"][0]
    assert open_reader(db).table("requests").height > 0
    assert not (tmp_path / "live.duckdb.live").exists() or not any(
        (tmp_path / "live.duckdb.live").rglob("*.parquet")
    )


def _start_kernels(lab_url: str, token: str, n: int) -> None:
    for _ in range(n):
        r = httpx.post(f"{lab_url}/api/kernels", params={"token": token}, json={}, timeout=60)
        assert r.status_code == 201, r.text


def _kernels_below(pid: int) -> int:
    return sum("ipykernel" in " ".join(p.cmdline()) for p in psutil.Process(pid).children(True))


@pytest.mark.slow
# SIGHUP reaches `lab` through the same handler as SIGTERM (toolkit.serve.processes.stop_signals),
# whose HUP path the serve test above takes: TERM and kill -9 here (each start of JupyterLab
# with two kernels and two engines costs ~45 s of a 2-core CI machine).
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["TERM", "KILL"])
def test_a_signal_to_lab_stops_server_engines_jupyterlab_and_kernels(
    sig: int, tmp_path: Path, kill_leftovers: list[int], procs: Any
) -> None:
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    port, lab_port = free_port(), free_port()
    db, log = tmp_path / "live.duckdb", tmp_path / "lab.log"
    proc = _start(["lab", *SMALL, "--notebook-dir", str(nbdir), "--port", str(port),
                   "--lab-port", str(lab_port), "--lab-token", "lt", "--token", "t",
                   "--db", str(db), "--no-browser"], log, tmp_path)  # fmt: skip
    kill_leftovers.append(proc.pid)
    procs.wait_for(
        lambda: proc.poll() is not None or "pdlab lab: JupyterLab" in log.read_text(),
        300,
        "pdlab lab to start the server and JupyterLab",
    )
    assert proc.poll() is None, log.read_text()[-3000:]
    _start_kernels(f"http://127.0.0.1:{lab_port}", "lt", 2)
    procs.wait_for(lambda: _kernels_below(proc.pid) == 2, 60, "two kernel processes")
    procs.wait_for(lambda: _served(f"http://127.0.0.1:{port}"), 120, "requests served")
    below = _tree(proc.pid)
    kill_leftovers.extend(below)
    names = [" ".join(psutil.Process(p).cmdline()) for p in below]
    assert sum("toolkit.cli serve" in n for n in names) == 1, names
    assert sum("toolkit.cli engine" in n for n in names) == 2, names
    assert sum("jupyterlab" in n for n in names) == 1, names
    assert sum("ipykernel" in n for n in names) == 2, names
    proc.send_signal(sig)
    code = proc.wait(120)
    assert code == (-signal.SIGKILL if sig == signal.SIGKILL else 0), log.read_text()[-3000:]
    assert procs.gone(below, 60), [
        n for p, n in zip(below, names, strict=True) if psutil.pid_exists(p)
    ]
    if sig != signal.SIGKILL:  # after a kill -9 the server still closes the run; wait for it
        runs = open_reader(db).runs()
        assert runs.height == 1 and not runs["live"][0]


def test_a_server_a_kernel_launched_stops_when_the_kernel_dies(
    tmp_path: Path, kill_leftovers: list[int], procs: Any
) -> None:
    """Notebook 04 without `pdlab lab` starts its own server (`launch_server`); a kernel
    killed before its last cell must not leave that server running."""
    db = tmp_path / "live.duckdb"
    script = (
        "import sys, time\n"
        "from toolkit.client import launch_server\n"
        "s = launch_server('--nodes', '4', '--split', '2P2D', '--agents', '8', db=sys.argv[1])\n"
        "print(s.proc.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    kernel = subprocess.Popen(
        [sys.executable, "-c", script, str(db)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    kill_leftovers.append(kernel.pid)
    assert kernel.stdout is not None
    server = int(kernel.stdout.readline())
    kill_leftovers.append(server)
    assert procs.running([server]) == [server]
    kernel.kill()  # as a kernel dies: no cleanup of its own
    kernel.wait()
    assert procs.gone([server], 60), "the server outlived the process that launched it"
    runs = open_reader(db).runs()
    assert runs.height == 1 and not runs["live"][0]  # it still closed its run
