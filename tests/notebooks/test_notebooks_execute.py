"""Every notebook runs headless (nbclient) at its "quick" size; any error fails.

The tests set PDLAB_QUICK=1 (each notebook's `run_size` then picks its quick configuration).
01, 02, 03, 05, 06 and 07 own their data: each writes `.data/<notebook>.duckdb` next to itself (02 also
copies the bundled torch-cluster run to `.data/02_torch_sample.duckdb`) and
never writes the live server's database, even when `PDLAB_DB` and `PDLAB_URL` are set as
`pdlab lab` sets them (checked here with a database holding another run). 01 and 02 read the
main job's run when `PDLAB_DB` or `../pdlab.duckdb` holds one, and simulate their own when not. 04 starts its own
`pdlab serve` (no PDLAB_URL), switches a node and reads the run while the server writes it.
Each runs in a temporary copy of notebooks/, so nothing lands in the repo. Also checked:
committed notebooks carry no outputs and no absolute paths, and the data and size of each
notebook are documented in its first cell.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from cluster.sim.runner import simulate
from cluster.sim.simulator import SimConfig
from telemetry import TABLES, open_reader
from toolkit.fit.synth import synth_logs

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
NAMES = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))
OWN_DATA = [n for n in NAMES if not n.startswith("04_")]  # only 04 talks to the server


def own_db(workdir: Path, name: str) -> Path:
    return workdir / ".data" / f"{Path(name).stem}.duckdb"


@pytest.fixture
def lab_env(tmp_path_factory: pytest.TempPathFactory, closed_port: int) -> dict[str, str]:
    """The environment `pdlab lab` gives a kernel: a server's URL and token (nothing listens
    there) and its database, which holds a run of its own."""
    live = tmp_path_factory.mktemp("lab") / "live.duckdb"
    synth_logs(live, nodes=1, prefill_iters=50, decode_iters=50, run_id="the-live-run")
    return {
        "PDLAB_DB": str(live),
        "PDLAB_URL": f"http://127.0.0.1:{closed_port}",
        "PDLAB_TOKEN": "x",
    }


def untouched(env: dict[str, str]) -> None:
    runs = open_reader(env["PDLAB_DB"]).runs()
    assert runs["run_id"].to_list() == ["the-live-run"]


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


def test_there_are_seven_notebooks() -> None:
    assert [n[:3] for n in NAMES] == ["01_", "02_", "03_", "04_", "05_", "06_", "07_"], NAMES


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


@pytest.mark.parametrize("name", OWN_DATA)
def test_a_notebook_documents_its_data_and_size_and_reads_no_environment(name: str) -> None:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    intro = nb.cells[0].source
    assert f"`.data/{Path(name).stem}.duckdb`" in intro
    assert "`SIZE`" in intro and '`"default"`' in intro and '`"full"`' in intro
    assert "PDLAB_QUICK=1" in intro
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert f'notebook_db("{Path(name).stem}")' in code and 'run_size("default")' in code
    for word in (
        "os.environ",
        "PDLAB_DB",
        "PDLAB_URL",
        "PDLAB_TOKEN",
        "PdlabClient",
        "launch_server",
    ):
        assert word not in code, f"{name} reads {word}: only notebook 04 talks to the server"


def test_01_quickstart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lab_env: dict[str, str]
) -> None:
    out = execute("01_quickstart.ipynb", tmp_path, monkeypatch, **lab_env)
    untouched(lab_env)
    assert "data: no main job's run (no finished run in ../pdlab.duckdb): simulating" in (
        "\n".join(out)
    )
    runs = open_reader(own_db(tmp_path, "01_quickstart.ipynb")).runs()
    assert runs.height == 1 and runs["run_id"][0] in "\n".join(out)
    assert any("run_id" in t and "kv_hit_rate" in t for t in out)
    assert sum("application/vnd.plotly.v1+json" in t for t in out) == 6


@pytest.mark.slow
def test_01_and_02_read_the_main_job_s_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The main job's database (`../pdlab.duckdb` from notebooks/, or `pdlab lab --db` as
    PDLAB_DB) holds a finished simulated run: 01 and 02 read it and write nothing there."""
    workdir, db = tmp_path / "notebooks", tmp_path / "pdlab.duckdb"
    workdir.mkdir()
    quick = SimConfig(workload="cc", nodes=4, split="2P2D", agents=16, duration_s=400,
                      warmup_s=150, window_s=120, slices=6)  # fmt: skip
    run = simulate(quick, db)["run_id"]
    synth_logs(db, nodes=1, prefill_iters=50, decode_iters=50, run_id="later-synth")
    before = table_rows(db)
    out = execute("01_quickstart.ipynb", workdir, monkeypatch)  # finds ../pdlab.duckdb
    text = "\n".join(out)
    assert f"data: the main job's run {run} of ../pdlab.duckdb" in text
    assert "kv_hit_rate" in text and text.count("application/vnd.plotly.v1+json") == 6
    assert not own_db(workdir, "01_quickstart.ipynb").exists()
    out = execute("02_fitting_node_coefficients.ipynb", workdir, monkeypatch, PDLAB_DB=str(db))
    text = "\n".join(out)
    assert f"data: part 2 fits the main job's run {run} of {db}" in text
    assert f"fitting run {run} of {db}" in text
    assert table_rows(db) == before  # only read


def table_rows(db: Path) -> dict[str, int]:
    with open_reader(db).connect() as con:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}


def test_02_fitting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lab_env: dict[str, str]
) -> None:
    out = execute("02_fitting_node_coefficients.ipynb", tmp_path, monkeypatch, **lab_env)
    untouched(lab_env)
    text = "\n".join(out)
    assert "(no finished run in ../pdlab.duckdb)" in text
    assert "== a100: prefill" in text and "== h100: decode" in text
    db = own_db(tmp_path, "02_fitting_node_coefficients.ipynb")
    runs = open_reader(db).runs()  # the synthetic run and the simulated one
    assert runs["source"].to_list() == ["synth", "sim"]
    assert f"fitting run {runs['run_id'][1]} of .data/02_fitting_node_coefficients.duckdb" in text
    # Part 4: the bundled torch run, fitted; measured phi(B) drawn against the model.
    assert (tmp_path / ".data" / "02_torch_sample.duckdb").exists()
    assert "heldout_mape_pct" in text and "p90_over_p10" in text
    assert "measured: experts_active / E" in text
    assert text.count("application/vnd.plotly.v1+json") == 6


def test_03_branch_counts_and_eviction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lab_env: dict[str, str]
) -> None:
    out = execute("03_branch_counts_and_eviction.ipynb", tmp_path, monkeypatch, **lab_env)
    untouched(lab_env)
    text = "\n".join(out)
    plotted = re.search(r"plotting run (\S+) of (\S+)", text)
    assert plotted is not None and plotted[2] == ".data/03_branch_counts_and_eviction.duckdb"
    runs = open_reader(own_db(tmp_path, "03_branch_counts_and_eviction.ipynb")).runs()
    assert runs["run_id"].to_list() == [plotted[1]]  # the run it made is the run it plots
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


def test_05_compare_policies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lab_env: dict[str, str]
) -> None:
    out = execute("05_compare_policies.ipynb", tmp_path, monkeypatch, **lab_env)
    untouched(lab_env)
    text = "\n".join(out)
    for variant in ("static planner", "arrow-like planner", "round-robin router", "lru eviction"):
        assert variant in text
    # Three metrics over seeds with 95% intervals, and two planners' split over time.
    assert text.count("application/vnd.plotly.v1+json") == 5
    assert "change vs gain / ttft / branch (base), paired by seed" in text
    runs = open_reader(own_db(tmp_path, "05_compare_policies.ipynb")).runs()
    assert runs.height == 2  # the two planners drawn; the comparison keeps summaries only
    # The split over time of each planner and seed, printed under "What this size can show".
    assert re.search(r"static planner\s+seed 0 \[\(0, '2P2D'\)\]", text), text[-2000:]
    assert re.search(r"static planner\s+seed 2 \[", text)


def test_06_twin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lab_env: dict[str, str]) -> None:
    out = execute("06_twin.ipynb", tmp_path, monkeypatch, **lab_env)
    untouched(lab_env)
    text = "\n".join(out)
    assert "replayed 300 requests" in text and "as run twin-rtx4090_llama31_8b_vllm" in text
    assert text.count("application/vnd.plotly.v1+json") == 3
    runs = open_reader(own_db(tmp_path, "06_twin.ipynb")).runs()
    assert runs["source"].to_list() == ["vllm-bench", "twin"]


def test_07_validation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lab_env: dict[str, str]
) -> None:
    out = execute("07_validation.ipynb", tmp_path, monkeypatch, **lab_env)
    untouched(lab_env)
    text = "\n".join(out)
    assert "imported 2 real runs into .data/07_validation.duckdb" in text
    for metric in ("span_s", "throughput_tick_mape", "prefix_hit_tick_mae", "kv_mem_tick_wape"):
        assert metric in text
    assert "peer:LLMServingSim" in text  # the peer's errors beside the twin's
    assert text.count("application/vnd.plotly.v1+json") == 2  # one figure per run
    runs = open_reader(own_db(tmp_path, "07_validation.ipynb")).runs()
    assert sorted(runs["run_id"].to_list()) == ["a6000-fig5-MD", "a6000-fig7-MD-PC-PS"]
