"""scripts/gpu_check.py --engines torch: the live torch cluster check, on CPU here.

Without CUDA, `--device cuda` exits 2 naming why (CI never needs a GPU); `--device cpu` runs
the whole check on this machine: cc agents through the proxy, a decode -> prefill switch
through the REST API that keeps the node's KV, fits of the logged passes, measured phi(B).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu_exits_2(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--engines", "torch", "--device", "cuda",
         "--db", str(tmp_path / "x.duckdb")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "no CUDA device" in r.stderr and not (tmp_path / "x.duckdb").exists()


@pytest.mark.slow
def test_the_torch_check_passes_on_cpu(tmp_path: Path) -> None:
    db = tmp_path / "check.duckdb"
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--engines", "torch", "--device", "cpu",
         "--duration", "16", "--programs", "6", "--db", str(db)],
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["problems"] == [] and out["turns_ok"] > 0 and out["device"] == "cpu"
    assert out["switch"]["lost_kv_blocks"] == 0 and out["switch"]["kv_after"] > 0
    assert out["phi"][0] == {**out["phi"][0], "B": 1, "measured": 0.125, "model": 0.125}
