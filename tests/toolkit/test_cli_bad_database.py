"""Every command given a --db that is not a DuckDB database: one line, exit code 2.

Only the command line is used here, so the same test runs against older code (where
`simulate`, `collect` and `serve` printed tracebacks).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bad(tmp_path: Path, kind: str) -> tuple[Path, str]:
    if kind == "sqlite":
        path = tmp_path / "other.sqlite"
        con = sqlite3.connect(path)
        con.execute("CREATE TABLE t (a)")
        con.commit()
        con.close()
        return path, "is not a DuckDB database (it looks like SQLite)"
    if kind == "text":
        path = tmp_path / "notes.duckdb"
        path.write_text("hello\n")
        return path, "is not a DuckDB database (it looks like text)"
    path = tmp_path / "folder"
    path.mkdir()
    return path, "is a directory, not a DuckDB database"


CASES = {
    "simulate": ("sqlite", ["simulate", "--nodes", "2", "--split", "1P1D", "--agents", "2",
                            "--duration", "5", "--warmup", "0", "--db", "{db}"]),
    "collect": ("text", ["collect", "kv-events", "--connect", "tcp://127.0.0.1:{closed}",
                         "--db", "{db}", "--seconds", "0"]),
    "serve": ("sqlite", ["serve", "--port", "0", "--token", "t", "--db", "{db}"]),
    "fit": ("directory", ["fit", "{db}"]),
    "recover": ("text", ["recover", "{db}"]),
}  # fmt: skip


@pytest.mark.parametrize("command", list(CASES))
def test_bad_database_is_one_line_and_exit_2(
    tmp_path: Path, command: str, closed_port: int
) -> None:
    kind, args = CASES[command]
    db, words = _bad(tmp_path, kind)
    argv = [a.format(db=db, closed=closed_port) for a in args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if command == "recover":  # the CLI registers it on merge: run the command function itself
        code = "import typer; from toolkit.cli.recover import recover_command as c; typer.run(c)"
        cmd = [sys.executable, "-c", code, *argv[1:]]
    else:
        cmd = [sys.executable, "-m", "toolkit.cli", *argv]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    err = " ".join(res.stderr.split())  # rich wraps long lines
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr and words in err, res.stderr
    assert not Path(f"{db}.live").exists()  # nothing left next to it
