"""`pdlab serve` binds its port before it starts anything (toolkit.serve.loop.bind_port).

CI once lost a torch cluster test to a race: the test picked a free port, `pdlab serve`
started three engines whose PD bootstrap and ZMQ streams took ephemeral ports, one of them
that very port, and uvicorn's bind then failed with errno 98 after the engines were up. The
server's socket is now bound first; a port in use is a one-line error before any engine
starts, for every composition root.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def taken_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize(
    "engines",
    [
        ["--nodes", "2", "--split", "1P1D", "--agents", "2"],
        ["--engines", "torch", "--nodes", "3", "--split", "1P2D", "--agents", "2"],
    ],
    ids=["sim", "torch"],
)
def test_a_port_in_use_is_refused_before_anything_starts(
    taken_port: int, engines: list[str], tmp_path: Path
) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", "serve", "--port", str(taken_port),
         "--db", str(tmp_path / "x.duckdb"), *engines],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    out = res.stdout + res.stderr
    assert res.returncode == 2, out
    assert f"cannot listen on 127.0.0.1:{taken_port}" in out and "Traceback" not in out, out
    assert "starting" not in out and "launching engine" not in out, out  # nothing started
    assert not (tmp_path / "x.duckdb").exists()  # and nothing stored
