"""A policy hook may not end the process: `os._exit` and `os.abort` inside a hook raise.

`sys.exit` in a hook raises SystemExit, which the guard (guard.py) turns into a PolicyError;
`os._exit(n)` ends the interpreter at once — no exception, no `finally`, no atexit — so a
hook calling it ended `pdlab simulate` with exit code n and no output (issue 28). Hooks stay
in the simulator's process (a hook runs per turn: an IPC round trip per call would cost more
than the simulation), and the exit is detected instead: the first guarded hook installs
replacements of `os._exit`, `os.abort` (and their `posix` twins) that, on a thread inside a
guarded hook call (`STATE.depth` > 0), raise `HookExitAttempt` — a BaseException, so
`except Exception` in the hook does not swallow it — and record the attempt, so the guard
fails the run with a PolicyError naming the policy and hook even if the hook caught it.
Everywhere else they do what they always did (a forked worker's `os._exit` is untouched).
What no in-process guard can stop: a hook that calls the C `_exit` through ctypes, or sends
its own process SIGKILL.
"""

from __future__ import annotations

import os
import posix
import threading
from collections.abc import Callable
from typing import Any, NoReturn

_TRAPPED = ("_exit", "abort")


class _State(threading.local):
    """Per thread: how deep in guarded hook calls, and the exit a hook attempted. The guard
    reads and writes it inline (a hook call is on the simulator's hot path)."""

    depth = 0
    attempted: str | None = None


STATE = _State()
_installed = False
_install_lock = threading.Lock()


class HookExitAttempt(BaseException):
    """Raised in a policy hook that tried to end the process (`what`: the call)."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


def _trap(name: str, original: Callable[..., Any]) -> Callable[..., NoReturn]:
    def trapped(*args: Any) -> NoReturn:
        if STATE.depth > 0:
            what = f"os.{name}({', '.join(repr(a) for a in args)})"
            STATE.attempted = what
            raise HookExitAttempt(what)
        original(*args)
        raise AssertionError("unreachable")  # pragma: no cover - the original never returns

    trapped.__name__ = name
    trapped.__doc__ = original.__doc__
    return trapped


def install() -> None:
    """Replace the process-exit functions once per process (idempotent, thread-safe)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        for module in (os, posix):
            for name in _TRAPPED:
                original = getattr(module, name, None)
                if original is not None:
                    setattr(module, name, _trap(name, original))
        _installed = True
