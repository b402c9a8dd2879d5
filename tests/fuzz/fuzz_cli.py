"""Run `pdlab` the way a user does, with its memory and time bounded and measured.

`run_cli` starts `python -m toolkit.cli ARGS` in a subprocess whose address space is capped
(`RLIMIT_AS`, 1.5 GiB: the interpreter with duckdb, pyarrow and numpy maps ~0.8 GiB, so a
command that reads a whole /dev/zero, or builds a hundred million agents, fails there instead
of taking the machine), kills it after `timeout_s`, and reads its peak RSS as the command's
own process saw it at exit (`VmHWM` of /proc/self/status, written by an atexit hook; not
`wait4`'s `ru_maxrss`, which keeps the high-water mark of the forked copy of this pytest
process, gigabytes late in a full run). `cli` runs a command in-process (typer's runner:
milliseconds, for the many hypothesis examples). `one_line_error` is what every refusal must
look like: non-zero exit, one line starting `error:` that names what was wrong, no traceback.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from typer.testing import CliRunner

from toolkit.cli import app

ROOT = Path(__file__).resolve().parents[2]
ADDRESS_SPACE_MB = 1536
RSS_CAP_MB = 600  # what a refused input may cost at most, interpreter and libraries included
_runner = CliRunner()


class Ran(NamedTuple):
    code: int
    out: str
    err: str
    peak_rss_mb: float
    seconds: float


# Runs `toolkit.cli` as `python -m` would, first registering a hook that writes this process's
# own peak RSS (kB, the high-water mark of the exec'd image only) to the file $_PDLAB_HWM_FILE.
_LAUNCH = """
import atexit, os, runpy

def _hwm():
    with open('/proc/self/status') as f:
        kb = next(line.split()[1] for line in f if line.startswith('VmHWM:'))
    with open(os.environ['_PDLAB_HWM_FILE'], 'w') as f:
        f.write(kb)

atexit.register(_hwm)
runpy.run_module('toolkit.cli', run_name='__main__', alter_sys=True)
"""


def _peak_rss_mb(hwm_file: Path) -> float:
    """The child's own peak RSS in MB as its exit hook wrote it; NaN (fails every bound) when
    it wrote none (killed before exit)."""
    try:
        return int(hwm_file.read_text()) / 1024
    except (OSError, ValueError):
        return float("nan")


def run_cli(
    *args: str,
    timeout_s: float = 60.0,
    address_space_mb: int = ADDRESS_SPACE_MB,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Ran:
    """`pdlab ARGS` in a subprocess with its address space capped; see the module docstring."""
    limit = address_space_mb << 20

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    with (
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        tempfile.TemporaryDirectory() as tmp,
    ):
        hwm_file = Path(tmp) / "hwm"
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-c", _LAUNCH, *args],
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            cwd=cwd or ROOT,
            env={
                **os.environ,
                "COLUMNS": "200",
                "_PDLAB_HWM_FILE": str(hwm_file),
                **(env or {}),
            },
            preexec_fn=cap,
        )
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        peak_mb = _peak_rss_mb(hwm_file)
        seconds = time.monotonic() - t0
        out.seek(0)
        err.seek(0)
        return Ran(
            proc.returncode,
            out.read().decode(errors="replace"),
            err.read().decode(errors="replace"),
            peak_mb,
            seconds,
        )


def cli(*args: str) -> tuple[int, str]:
    """`pdlab ARGS` in-process: (exit code, stdout and stderr together)."""
    res = _runner.invoke(app, list(args))
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception  # a traceback is a failure of the test, shown as such
    return res.exit_code, res.output


def one_line_error(code: int, output: str, *words: str) -> str:
    """Assert a refusal: non-zero exit, no traceback, one `error:` line (rich may wrap it)
    holding `words` (or click's usage error for a value of the wrong type); returns the
    message with its wrapping undone."""
    assert code not in (0, None), output
    assert "Traceback" not in output, output
    if code == 2 and "Invalid value for" in output:  # click's usage error: a wrong type
        return " ".join(output.split())
    lines = [ln for ln in output.splitlines() if ln.strip()]
    starts = [i for i, ln in enumerate(lines) if "error:" in ln]
    assert len(starts) == 1, output
    message = " ".join(ln.strip() for ln in lines[starts[0] :])
    for w in words:
        assert w in message, (w, message)
    return message
