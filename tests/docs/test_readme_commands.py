"""The commands README.md shows in its code blocks, run as a new user would.

Every command of every ```bash block is classified below, by its exact text:
- RUN: run as written, in a fresh directory, with this environment's `pdlab` on PATH (what
  `. .venv/bin/activate` does); commands naming `pdlab.duckdb` read the main job's database
  made there first.
- SHORTENED: the main job, run with the documented shortening `SHORTEN` (a minute of
  simulated time instead of half an hour; same workload, nodes, agents and fit), asserting
  the database holds the run and the summary and fits print.
- NOT_RUN: with the reason and the test file that covers it (checked to exist).
A command the README gains and this table lacks fails `test_every_readme_command_is_classified`.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from cluster.data.catalog import DATASETS
from telemetry.reader import TelemetryReader

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BIN = Path(sys.executable).parent

MAIN_JOB = (
    ".venv/bin/pdlab simulate --workload cc --nodes 9 --agents 126 --duration 1800 "
    "--warmup 600 --db pdlab.duckdb --fit"
)
# The main job's shortening: 60 simulated seconds, 20 of warmup (the gain planner's learn
# phase fits within it); everything else as written.
SHORTEN = {"--duration 1800": "--duration 60", "--warmup 600": "--warmup 20"}

SHORTENED = {MAIN_JOB}
RUN = {
    "pdlab runs list pdlab.duckdb",
    "pdlab report pdlab.duckdb -o report.html",
    "pdlab fit pdlab.duckdb --form auto",
    "pdlab data list",
}
NOT_RUN = {
    "python3 -m venv .venv": ("creates the environment this test runs in", None),
    ".venv/bin/pip install -q -e .": ("installs the package this test runs", None),
    ".venv/bin/pip install -q -e '.[dev]'": ("installs the package this test runs", None),
    ".venv/bin/python -m pytest -q": ("the whole test suite, this test among them", None),
    ". .venv/bin/activate": (
        "puts the environment's pdlab on PATH, as the RUN commands' PATH here does",
        None,
    ),
    "pdlab lab": (
        "starts a server and JupyterLab until Ctrl-C",
        "tests/toolkit/test_lab.py",
    ),
}


def readme_commands(text: str) -> list[str]:
    """Each command of each ```bash block: continuations joined, comments and `&&` split."""
    out: list[str] = []
    for block in re.findall(r"^```(?:bash|sh|shell)\n(.*?)^```", text, re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.split(r"(?:^|\s)#\s", line, maxsplit=1)[0].strip()
            if line:
                out += [" ".join(part.split()) for part in line.split("&&")]
    return out


COMMANDS = readme_commands(README.read_text())


def _run(cmd: str, cwd: Path, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "120"}
    argv = shlex.split(cmd)
    if argv[0] == ".venv/bin/pdlab":  # the environment's own pdlab, wherever it lives
        argv[0] = str(BIN / "pdlab")
    res = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
    assert res.returncode == 0, f"{cmd}: exit {res.returncode}\n{res.stdout[-2000:]}{res.stderr}"
    return res


def test_the_parser_reads_blocks_continuations_comments_and_chains() -> None:
    text = (
        "x\n```bash\na --x 1 \\\n  --y 2   # comment\nb && c\n# only a comment\n```\n"
        "```python\nnot_a_command()\n```\n"
    )
    assert readme_commands(text) == ["a --x 1 --y 2", "b", "c"]


def test_every_readme_command_is_classified() -> None:
    known = SHORTENED | RUN | set(NOT_RUN)
    assert COMMANDS[:3] == ["python3 -m venv .venv", ".venv/bin/pip install -q -e .", MAIN_JOB]
    unclassified = [c for c in COMMANDS if c not in known]
    assert not unclassified, f"README commands this test does not classify: {unclassified}"
    stale = sorted(known - set(COMMANDS))
    assert not stale, f"classified commands the README no longer shows: {stale}"
    for cmd, (why, covered_by) in NOT_RUN.items():
        assert why, cmd
        assert covered_by is None or (ROOT / covered_by).is_file(), (cmd, covered_by)


def test_the_shortening_applies_to_the_main_job() -> None:
    short = MAIN_JOB
    for long_part, short_part in SHORTEN.items():
        assert long_part in short
        short = short.replace(long_part, short_part)
    assert "--duration 60 --warmup 20" in short


@pytest.fixture(scope="module")
def main_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The README's main job, shortened, in a fresh directory: (directory, its stdout)."""
    cwd = tmp_path_factory.mktemp("readme")
    cmd = MAIN_JOB
    for long_part, short_part in SHORTEN.items():
        cmd = cmd.replace(long_part, short_part)
    return cwd, _run(cmd, cwd).stdout


@pytest.mark.slow
def test_main_job_shortened(main_job: tuple[Path, str]) -> None:
    cwd, out = main_job
    db = cwd / "pdlab.duckdb"
    runs = TelemetryReader(db).runs()
    assert runs["status"].to_list() == ["finished"] and runs["source"].to_list() == ["sim"]
    run_id = runs["run_id"][0]
    with duckdb.connect(str(db), read_only=True) as con:
        requests = con.execute("SELECT count(*) FROM requests WHERE run_id = ?", [run_id])
        assert requests.fetchone()[0] > 100
        nodes = con.execute(
            "SELECT count(DISTINCT node_id) FROM model_fits WHERE run_id = ?", [run_id]
        ).fetchone()[0]
        assert nodes == 9  # --fit stored every node's fits
    assert "iteration-time fits of run" in out and run_id in out
    assert "mean_tpot_s" in out  # the summary table
    assert re.search(rf"telemetry of run {run_id} in \S*pdlab\.duckdb", out)
    assert "pdlab report pdlab.duckdb" in out  # the next commands


def _needs_main_job(cmd: str) -> bool:
    return "pdlab.duckdb" in shlex.split(cmd)


@pytest.mark.parametrize(
    "cmd",
    [pytest.param(c, marks=[pytest.mark.slow] if _needs_main_job(c) else []) for c in sorted(RUN)],
)
def test_readme_command_runs_as_written(
    cmd: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    run_id = None
    cwd = tmp_path
    if _needs_main_job(cmd):
        cwd, _ = request.getfixturevalue("main_job")
        run_id = TelemetryReader(cwd / "pdlab.duckdb").runs()["run_id"][0]
    out = _run(cmd, cwd).stdout
    if cmd.startswith("pdlab runs list"):
        assert run_id in out and "sim" in out
    elif cmd.startswith("pdlab report"):
        html = (cwd / "report.html").read_text()
        assert run_id in html and "plotly" in html.lower()
    elif cmd.startswith("pdlab fit"):
        assert run_id in out
        assert {int(n) for n in re.findall(r"^\s+(\d+)\s+decode", out, re.M)} == set(range(9))
    elif cmd == "pdlab data list":
        assert "bundled copy:" in out
        assert all(f"{d.name}  (" in out for d in DATASETS), out
    else:
        raise AssertionError(f"no check for {cmd}")
