"""Every notebook runs headless (nbclient) against a small simulated run; any error fails.

Notebooks take their parameters from the environment: PDLAB_QUICK=1 (small runs, short
waits), PDLAB_DB (the run to read, or where to write one). 02 and 03 read one small cc run
made here (host memory kept small so eviction happens); 01 and 05 simulate their own; 04
starts its own `pdlab serve` (no PDLAB_URL), switches a node and reads the run while the
server writes it. Each runs in a temporary copy of notebooks/, so nothing lands in the repo.
Also checked: committed notebooks carry no outputs and no absolute paths.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from cluster.sim.runner import simulate
from cluster.sim.simulator import SimConfig

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
NAMES = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    db = tmp_path_factory.mktemp("nbrun") / "small.duckdb"
    cfg = SimConfig(
        workload="cc", nodes=4, split="2P2D", agents=24, duration_s=600, warmup_s=200,
        window_s=120, slices=6, l2_tokens=1_000_000,
    )  # fmt: skip
    simulate(cfg, db)
    yield db


def execute(name: str, workdir: Path, monkeypatch: pytest.MonkeyPatch, **env: str) -> list[str]:
    """Run notebook `name` in `workdir` with `env`; returns the text of every output."""
    shutil.copy(NOTEBOOKS / name, workdir / name)
    monkeypatch.setenv("PDLAB_QUICK", "1")
    for var in ("PDLAB_URL", "PDLAB_TOKEN", "PDLAB_DB"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    nb = nbformat.read(workdir / name, as_version=4)
    client = NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(workdir)}}
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    texts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":  # allow_errors is off; never reached
                raise AssertionError(f"{name}: {out['ename']}: {out['evalue']}")
            texts.append(out.get("text", "") + json.dumps(out.get("data", {})))
    return texts


def test_there_are_five_notebooks() -> None:
    assert [n[:3] for n in NAMES] == ["01_", "02_", "03_", "04_", "05_"], NAMES


@pytest.mark.parametrize("name", NAMES)
def test_committed_notebook_is_output_free_and_relative(name: str) -> None:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{name} cell {i} has outputs: strip them"
            assert cell.execution_count is None, f"{name} cell {i} has an execution count"
            assert not re.search(r"['\"](/|[A-Za-z]:\\)", cell.source), (
                f"{name} cell {i} uses an absolute path"
            )


def test_01_quickstart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = execute("01_quickstart.ipynb", tmp_path, monkeypatch, PDLAB_DB="nb01.duckdb")
    assert (tmp_path / "nb01.duckdb").exists()  # relative to the notebook's directory
    assert any("run_id" in t and "kv_hit_rate" in t for t in out)
    assert sum("application/vnd.plotly.v1+json" in t for t in out) == 6


def test_02_fitting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_run: Path) -> None:
    out = execute(
        "02_fitting_node_coefficients.ipynb", tmp_path, monkeypatch, PDLAB_DB=str(small_run)
    )
    text = "\n".join(out)
    assert "== a100: prefill" in text and "== h100: decode" in text
    assert (tmp_path / "synthetic.duckdb").exists()
    assert text.count("application/vnd.plotly.v1+json") == 4


def test_03_branch_counts_and_eviction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_run: Path
) -> None:
    out = execute(
        "03_branch_counts_and_eviction.ipynb", tmp_path, monkeypatch, PDLAB_DB=str(small_run)
    )
    text = "\n".join(out)
    assert "referenced_share" in text and "host" in text
    assert text.count("application/vnd.plotly.v1+json") == 4


def test_04_live_cluster_control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = execute("04_live_cluster_control.ipynb", tmp_path, monkeypatch)
    text = "\n".join(out)
    assert "application/vnd.jupyter.widget-view+json" in text  # the dashboard
    assert "'trigger': 'manual'" in text  # the switch the notebook made
    assert "before" in text and "after" in text  # its effect, read from the live run
    assert "notebook 04 done" in text
    assert (tmp_path / "live.duckdb").exists()


def test_05_compare_policies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = execute("05_compare_policies.ipynb", tmp_path, monkeypatch, PDLAB_DB="nb05.duckdb")
    text = "\n".join(out)
    for variant in ("static planner", "arrow-like planner", "round-robin router", "lru eviction"):
        assert variant in text
    assert text.count("application/vnd.plotly.v1+json") == 4
