"""`pip install .` into a fresh virtual environment installs no torch, and there simulate,
fit, report, import, profile import, twin and `pdlab lab` on a simulated cluster work, on
the real data bundled in the wheel (no full copy is next to site-packages), while
`pdlab engine` says in one line how to get the engine extra. pip's cache serves the
dependencies (no --no-deps), so the environment is what a user gets."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from toolkit.client import free_port

ROOT = Path(__file__).resolve().parents[2]


def _run(argv: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PDLAB_DATA_DIR")}
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.slow
def test_a_venv_without_torch_runs_everything_but_the_engine(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = _run([str(venv / "bin/pip"), "install", "-q", str(ROOT)], tmp_path, timeout=1500)
    assert pip.returncode == 0, pip.stderr[-3000:]
    install_s = time.monotonic() - t0
    py, pdlab = str(venv / "bin/python"), str(venv / "bin/pdlab")
    assert _run([py, "-c", "import torch"], tmp_path).returncode != 0  # no torch there
    work = tmp_path / "work"
    work.mkdir()

    def ok(*args: str) -> str:
        res = _run([pdlab, *args], work)
        assert res.returncode == 0, (args, res.stdout[-2000:], res.stderr[-2000:])
        return res.stdout

    out = ok("simulate", "--nodes", "2", "--split", "1P1D", "--agents", "6", "--duration",
             "150", "--warmup", "30", "--db", "pdlab.duckdb", "--fit")  # fmt: skip
    assert "iteration-time fits of run" in out and "pdlab lab --db pdlab.duckdb" in out
    ok("fit", "pdlab.duckdb", "--bootstrap", "0")
    assert "wrote" in ok("report", "pdlab.duckdb", "-o", "report.html")
    run_dir = ok("data", "path", "vllm-rtx4090-llama31-8b").strip()
    assert "/site-packages/cluster/data/files/" in run_dir  # the wheel's bundled copy
    ok("import", "lss-bench", run_dir, "--db", "real.duckdb")
    prof = ok("data", "path", "profile-rtx4090-llama31-8b").strip()
    model = ok("data", "path", "models/meta-llama/Llama-3.1-8B.json").strip()
    ok("profile", "import", prof, "--model-config", model, "-o", "rtx4090.json")
    twin = ok("twin", "real.duckdb", "--run", "vllm-rtx4090_llama31_8b_vllm",
              "--profile", "rtx4090.json")  # fmt: skip
    assert "twin of run vllm-rtx4090_llama31_8b_vllm: 300 requests replayed" in twin
    res = _run([pdlab, "engine"], work)
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0
    assert "pip install 'pdlab[engine]'" in res.stderr

    nbdir = work / "notebooks"
    nbdir.mkdir()
    port, lab_port = free_port(), free_port()
    log = work / "lab.log"
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(work / "runtime")}
    env.pop("PYTHONPATH", None)
    with log.open("wb") as f:
        lab = subprocess.Popen(
            [pdlab, "lab", "--no-browser", "--notebook-dir", str(nbdir), "--port", str(port),
             "--lab-port", str(lab_port), "--db", "pdlab.duckdb"],
            cwd=work, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while "pdlab lab: JupyterLab" not in log.read_text():
            assert lab.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        time.sleep(5)
        lab.send_signal(signal.SIGTERM)
        assert lab.wait(180) == 0, log.read_text()[-3000:]
    finally:
        if lab.poll() is None:
            lab.kill()
    assert "consolidated run" in log.read_text()
    print(f"venv + pip install . (no torch): {install_s:.0f} s")
