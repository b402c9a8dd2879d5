"""`pdlab serve` refuses bad options before binding a port (or starting an engine), with
messages naming what is allowed."""

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
        (["--engines", "gpu"], "--engines must be one of sim, torch"),
        (["--engines", "torch", "--split", "collocated"], "needs a PD split such as 1P2D"),
        (["--engines", "torch", "--split", "2P2D"], "split 2P2D needs >= 1 prefill"),
        (["--engines", "torch", "--model", "huge"], "unknown model preset 'huge'"),
        (["--engines", "torch", "--eviction", "fifo"], "unknown eviction 'fifo'"),
        (["--engines", "torch", "--token-scale", "0"], "--token-scale must be > 0"),
        (["--engines", "torch", "--workload", "nope"], "unknown workload 'nope'"),
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
