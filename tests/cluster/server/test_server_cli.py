"""`pdlab serve` refuses bad options before binding a port, with messages naming what is allowed."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from toolkit.cli import app


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--speed", "0"], "--speed must be in (0, 100000]"),
        (["--planner-mode", "sometimes"], "planner mode must be one of auto, advise, off"),
        (["--split", "3P3D", "--nodes", "4"], "split 3P3D needs >= 1 prefill and >= 1 decode"),
        (["--eviction", "fifo"], "unknown eviction 'fifo'; choose one of:"),
    ],
)
def test_serve_rejects_bad_options(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["serve", "--port", "1", *args])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


def test_lab_rejects_a_missing_notebook_directory(tmp_path) -> None:  # type: ignore[no-untyped-def]
    result = CliRunner().invoke(app, ["lab", "--notebook-dir", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "does not exist" in " ".join(result.output.split())
