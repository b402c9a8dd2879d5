"""The processes `pdlab serve` and `pdlab lab` start, and how they stop them all.

- `stop_signals()`: SIGTERM and SIGHUP act like Ctrl-C (KeyboardInterrupt), so the
  `finally` blocks that stop children and close the telemetry run run on every polite
  signal. While a uvicorn server runs (`serving(server)`), SIGHUP asks it to shut down
  gracefully as uvicorn does for SIGINT and SIGTERM itself.
- `spawn()`: a child in a session of its own (a terminal's Ctrl-C reaches only its
  parent, which stops the children in order) that Linux sends SIGTERM when its parent
  dies (`PR_SET_PDEATHSIG`), so even a `kill -9` of `pdlab lab` leaves no server behind.
- `stop_tree()`: the polite signal to a child, then SIGTERM and SIGKILL to whatever is
  left of it and of every process below it (JupyterLab's kernels live in sessions of
  their own and survive a signal to JupyterLab's group), found with psutil before the
  first signal.
- `exit_with_parent()`: a process that must not outlive its launcher (`pdlab serve
  --parent-pid`, started by a notebook's kernel or by `pdlab lab`) sends itself SIGTERM
  once the launcher is gone, so it shuts down as on a polite signal.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import IO, Any

import psutil

PR_SET_PDEATHSIG = 1


class _Handler:
    server: Any = None  # the uvicorn.Server being run, if any


_state = _Handler()


def log_to_stderr() -> None:
    """A live server's logs: INFO lines with timestamps on stderr, httpx's per-request lines
    left out (one per proxied request)."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    server = _state.server
    if server is not None and not server.should_exit:
        server.should_exit = True  # graceful, as uvicorn does for SIGINT and SIGTERM
        return
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def stop_signals() -> None:
    """SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread (see module docstring)."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)


@contextlib.contextmanager
def serving(server: Any) -> Iterator[None]:
    """While `server` (uvicorn) runs, SIGHUP shuts it down gracefully."""
    _state.server = server
    try:
        yield
    finally:
        _state.server = None


def _die_with_parent() -> Callable[[], None] | None:
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before fork
    sigterm = int(signal.SIGTERM)

    def child() -> None:
        prctl(PR_SET_PDEATHSIG, sigterm, 0, 0, 0)

    return child


def spawn(
    argv: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    stdout: IO[bytes] | int | None = None,
) -> subprocess.Popen[bytes]:
    """Start `argv` in its own session, to be sent SIGTERM if this process dies.

    Call it from the main thread of a process without other threads (the death signal
    follows the thread that forked; the pre-exec hook runs between fork and exec)."""
    return subprocess.Popen(
        list(argv),
        env=env,
        stdout=stdout,
        stderr=subprocess.STDOUT if stdout is not None else None,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=_die_with_parent(),  # see the docstring
    )


def exit_with_parent(parent_pid: int, poll_s: float = 0.5) -> threading.Thread:
    """Send this process SIGTERM once `parent_pid` is no longer its parent (it died and
    this process was reparented); a daemon thread that polls every `poll_s`."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            threading.Event().wait(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)

    t = threading.Thread(target=watch, name="pdlab-parent-watch", daemon=True)
    t.start()
    return t


def descendants(pid: int) -> list[psutil.Process]:
    """Every live process below `pid` (empty if it is gone)."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def stop_tree(
    proc: subprocess.Popen[bytes], first: int = signal.SIGINT, timeout_s: float = 40.0
) -> int | None:
    """Send `first` to `proc` and wait up to `timeout_s` for it to exit; then SIGTERM and,
    5 s later, SIGKILL to everything left of it and of the processes below it. Returns
    `proc`'s exit code."""
    below = descendants(proc.pid)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(first)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout_s)
    survivors = [p for p in [*below, *_as_psutil(proc)] if _alive(p)]
    for p in survivors:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, survivors = psutil.wait_procs(survivors, timeout=5)
    for p in survivors:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(survivors, timeout=5)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
    return proc.returncode


def _as_psutil(proc: subprocess.Popen[bytes]) -> list[psutil.Process]:
    if proc.poll() is not None:
        return []
    try:
        return [psutil.Process(proc.pid)]
    except psutil.NoSuchProcess:
        return []


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


__all__ = ["descendants", "exit_with_parent", "serving", "spawn", "stop_signals", "stop_tree"]
