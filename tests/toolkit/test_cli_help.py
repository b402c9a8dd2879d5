"""`pdlab … --help` is whole at 80 and 120 columns, every option says what it is, and the
small CLI clutter items of issue 26 stay fixed (toolkit/cli/style.py, commands_engine.py,
telemetry/live.py, the fit key)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from toolkit.cli import app
from toolkit.fit.synth import synth_logs

ROOT = Path(__file__).resolve().parents[2]


def _commands() -> Iterator[tuple[list[str], Any]]:
    def walk(cmd: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
        if hasattr(cmd, "commands"):  # a group (typer vendors its own click)
            for name, sub in cmd.commands.items():
                yield from walk(sub, [*path, name])
        else:
            yield path, cmd

    yield from walk(typer.main.get_command(app), [])


COMMANDS = list(_commands())


@pytest.mark.parametrize("columns", [80, 120])
def test_simulate_help_shows_every_option_whole_at_80_and_120_columns(columns: int) -> None:
    env = {**os.environ, "COLUMNS": str(columns)}
    out = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", "simulate", "--help"],
        capture_output=True, text=True, env=env, timeout=120, check=True,
    ).stdout  # fmt: skip
    assert not re.search(r"--[\w-]+(…|\.\.\.)", out)
    assert max(len(line) for line in out.splitlines()) <= columns
    cmd = dict((" ".join(p), c) for p, c in COMMANDS)["simulate"]
    names = [o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")]
    assert len(names) > 40
    for name in names:  # each long option appears whole, followed by a space or a comma
        assert any(tok.rstrip(",") == name for line in out.splitlines() for tok in line.split()), (
            f"{name} is not shown whole at {columns} columns"
        )


@pytest.mark.parametrize(("path", "cmd"), COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_option_has_help_and_no_name_is_cut(path: list[str], cmd: Any) -> None:
    for p in cmd.params:
        assert getattr(p, "help", None), f"pdlab {' '.join(path)} {p.opts} has no help"
    res = CliRunner().invoke(app, [*path, "--help"], terminal_width=80)
    assert res.exit_code == 0, res.output
    assert not re.search(r"--[\w-]+…", res.output), res.output


def test_the_command_list_shows_each_first_paragraph_whole() -> None:
    res = CliRunner().invoke(app, ["--help"], terminal_width=120)
    text = " ".join(res.output.split())
    # click alone would cut "Fit prefill (Eq. 1) ..." at "(Eq."
    assert "Fit prefill (Eq. 1) and decode (Eq. 2) iteration-time models per node" in text


def test_engine_role_collocated_is_the_default_and_null_an_alias() -> None:
    from toolkit.cli.engine import ROLES

    cmd = dict((" ".join(p), c) for p, c in COMMANDS)["engine"]
    role = next(p for p in cmd.params if p.name == "role")
    assert role.default == "collocated"
    assert ROLES["collocated"] == ROLES["null"] == "null"  # the engine's (SGLang's) name
    res = CliRunner().invoke(app, ["engine", "--role", "both"])
    assert res.exit_code == 2
    assert "--role must be collocated (or null), prefill or decode, got 'both'" in res.output


def test_a_command_that_stores_rows_leaves_no_empty_live_directory(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    synth_logs(db, nodes=1, prefill_iters=60, decode_iters=60, run_id="r")
    assert not (tmp_path / "t.duckdb.live").exists()
    out = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", "fit", str(db), "--bootstrap", "0"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    assert "rows written to model_fits" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.duckdb"]


def test_the_fit_table_prints_a_key_of_each_form_it_shows(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    synth_logs(db, nodes=1, prefill_iters=200, decode_iters=200, run_id="r")
    res = CliRunner().invoke(app, ["fit", str(db), "--form", "ctx", "--bootstrap", "0"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    key = [line for line in lines if line.startswith(("key:", "     "))]
    assert any("prefill" in k and "c0 + c1*sum t_uc" in k and "(Eq. 1)" in k for k in key)
    assert any("decode (ctx)" in k and "+ d3*sum ctx" in k for k in key), res.output
    assert "decode d0 d1 d2 (Eq. 2)" not in res.output  # the old caption, wrong under d3


def test_notebook_data_is_ignored_by_git() -> None:
    out = subprocess.run(
        ["git", "check-ignore", "-q", "notebooks/.data/01_quickstart.duckdb"], cwd=ROOT
    )
    assert out.returncode == 0
