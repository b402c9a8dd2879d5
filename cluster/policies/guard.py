"""Guarded policy hooks: any failure names the policy, the hook and the simulated time.

User policies (paper 003 §5.3, App. E) are arbitrary Python run inside the simulator's
loop, so every hook the loader binds is wrapped by `GuardedHook`:

- an exception, `SystemExit` included, becomes a `PolicyError` naming the policy, the hook
  and the simulated time `now` (the hook's last argument) with the original message; a
  `KeyboardInterrupt` passes through untouched (the user stopped the run);
- `os._exit` or `os.abort` called in a hook raises there instead of ending the process, and
  fails the run the same way, even if the hook catches it (exit_trap.py);
- a call that runs longer than `budget_s` wall seconds is stopped and fails the run.

How a hook in an infinite loop is stopped: one watchdog thread per process checks the armed
calls. On the main thread it sends a signal to it (a real-time signal, SIGRTMIN+3, where the
OS has them, else SIGALRM), whose handler (installed by the first guard made on the main
thread, only if that signal had no handler) raises `HookBudgetExceeded` — a signal also
interrupts a hook blocked in `time.sleep` or a socket call. Off the main thread (a live
server's pacing thread), and on the main thread when another handler owns the signal, it
raises the exception asynchronously in the hook's thread (`PyThreadState_SetAsyncExc`): that
takes effect at the hook's next Python bytecode, so a hook blocked inside one long C call is
stopped only when that call returns. The exception derives from BaseException so `except
Exception` in a hook cannot swallow it, and the watchdog fires again every budget period
while the hook keeps running; a hook that swallows it and returns still fails the run. (A
hook that catches BaseException in an endless loop cannot be stopped from inside its thread:
it is interrupted again and again.)
"""

from __future__ import annotations

import collections
import ctypes
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from cluster.core import ConfigError
from cluster.policies import exit_trap
from cluster.policies.errors import PolicyError
from cluster.size_limits import DEFAULT_HOOK_BUDGET_S as DEFAULT_HOOK_BUDGET_S

# DEFAULT_HOOK_BUDGET_S: wall seconds one hook call may take before the run fails (kept
# beside its ceiling in cluster.size_limits, where the simulator's config reads it).

_NO_EXIT = "(a policy hook may not end the process)"
_IDLE_EXIT_S = 5.0  # the watchdog thread ends after this long without armed calls
# The watchdog checks armed calls every budget/20 of the smallest budget, at least every 0.5 s:
# a hook is stopped within 0.5 s past its budget, and the default 10 s budget wakes the thread
# twice a second, not twenty times (each wake takes the GIL from the simulator's loop).
_MAX_POLL_S = 0.5
# The signal that interrupts the main thread: a real-time one nobody else uses, where the OS
# has them (SIGALRM is taken by timers, test runners' timeouts, ...).
_SIGNAL: int | None = (
    signal.SIGRTMIN + 3 if hasattr(signal, "SIGRTMIN") else getattr(signal, "SIGALRM", None)
)


class HookBudgetExceeded(BaseException):
    """Raised inside a hook that ran past its budget (not an Exception: hooks can't catch it
    with `except Exception`)."""


def check_budget(budget_s: float | None) -> float | None:
    if budget_s is not None and not (isinstance(budget_s, int | float) and budget_s > 0):
        raise ConfigError(
            f"hook_budget_s must be a number of seconds > 0 or None, got {budget_s!r}"
        )
    return None if budget_s is None else float(budget_s)


class _Call:
    """One armed hook call."""

    __slots__ = ("budget_s", "deadline", "fired", "ident")

    def __init__(self, ident: int, budget_s: float) -> None:
        self.ident = ident
        self.budget_s = budget_s
        self.deadline = time.monotonic() + budget_s
        self.fired = False


class _Watchdog:
    """Process-wide: tracks armed calls, interrupts those past their deadline."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: dict[int, _Call] = {}
        self._thread: threading.Thread | None = None
        self._main_ident = threading.main_thread().ident
        self.main_call: _Call | None = None  # read by the signal handler (no lock there)
        self.signals_sent: collections.deque[int] = collections.deque()
        self._poll_s = _MAX_POLL_S

    # -- hook side ---------------------------------------------------------------------------

    def arm(self, budget_s: float) -> _Call:
        call = _Call(threading.get_ident(), budget_s)
        with self._lock:
            self._armed[id(call)] = call
            self._poll_s = min(self._poll_s, budget_s / 20)
            if call.ident == self._main_ident:
                self.main_call = call
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="pdlab-hook-watchdog", daemon=True
                )
                self._thread.start()
        return call

    def disarm(self, call: _Call) -> bool:
        """Forget `call` (idempotent); True if the watchdog fired on it."""
        with self._lock:
            if self._armed.pop(id(call), None) is not None and call.fired:
                # Cancel an asynchronous exception that was not delivered yet.
                _set_async_exc(call.ident, None)
            if self.main_call is call:
                self.main_call = None
        return call.fired

    # -- watchdog thread ---------------------------------------------------------------------

    def _run(self) -> None:
        idle_since = time.monotonic()
        while True:
            time.sleep(self._poll_s)
            now = time.monotonic()
            with self._lock:
                if not self._armed:
                    if now - idle_since > _IDLE_EXIT_S:
                        self._thread = None
                        self._poll_s = _MAX_POLL_S
                        return
                    continue
                idle_since = now
                for call in self._armed.values():
                    if now >= call.deadline:
                        call.fired = True
                        call.deadline = now + call.budget_s  # fire again if it keeps running
                        self._interrupt(call)

    def _interrupt(self, call: _Call) -> None:
        if call.ident == self._main_ident and self.handler_active():
            assert _SIGNAL is not None
            self.signals_sent.append(call.ident)
            signal.pthread_kill(call.ident, _SIGNAL)
        else:
            _set_async_exc(call.ident, HookBudgetExceeded)

    # -- main-thread signal handler ------------------------------------------------------------

    def handler_active(self) -> bool:
        return _SIGNAL is not None and signal.getsignal(_SIGNAL) == self._on_signal

    def install_handler(self) -> None:
        """Own the interrupting signal, if we are on the main thread and nobody else does."""
        if _SIGNAL is None or not hasattr(signal, "pthread_kill") or self.handler_active():
            return
        if threading.get_ident() != self._main_ident:
            return
        if signal.getsignal(_SIGNAL) not in (signal.SIG_DFL, None):
            return
        signal.signal(_SIGNAL, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        try:
            self.signals_sent.popleft()
        except IndexError:
            # Not ours: behave as the signal did before (its default action ends the process).
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        call = self.main_call
        if call is not None and call.fired:
            raise HookBudgetExceeded()


def _set_async_exc(ident: int, exc: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(ident), ctypes.py_object(exc) if exc is not None else None
    )


WATCHDOG = _Watchdog()


class GuardedHook:
    """A policy hook that fails loudly and within a time budget (see the module docstring)."""

    __slots__ = ("budget_s", "family", "fn", "hook", "policy")

    def __init__(
        self,
        fn: Callable[..., Any],
        family: str,
        policy: str,
        hook: str,
        budget_s: float | None,
    ) -> None:
        self.fn = fn
        self.family = family
        self.policy = policy
        self.hook = hook
        self.budget_s = budget_s
        exit_trap.install()
        if budget_s is not None:
            WATCHDOG.install_handler()

    def _where(self, args: tuple[Any, ...]) -> str:
        now = args[-1] if args else None
        at = f" at t={now:.3f} s" if isinstance(now, int | float) else ""
        return f"{self.family} policy {self.policy!r}, hook {self.hook}{at}"

    def _over_budget(self, args: tuple[Any, ...]) -> PolicyError:
        return PolicyError(
            f"{self._where(args)}: ran longer than its budget of {self.budget_s:g} s and was "
            "stopped (a hook runs on every call and must return quickly; raise the budget "
            "with hook_budget_s)"
        )

    def __call__(self, *args: Any) -> Any:
        state = exit_trap.STATE
        depth = state.depth
        state.depth = depth + 1
        try:
            result = self._call(args)
        finally:
            state.depth = depth
            attempted = state.attempted
            if attempted is not None and depth == 0:
                state.attempted = None
        if attempted is not None and depth == 0:  # it caught HookExitAttempt and returned
            raise PolicyError(f"{self._where(args)}: called {attempted} {_NO_EXIT}")
        return result

    def _call(self, args: tuple[Any, ...]) -> Any:
        if self.budget_s is None:
            try:
                return self.fn(*args)
            except KeyboardInterrupt:
                raise
            except BaseException as exc:
                raise self._failed(args, exc) from exc
        call = WATCHDOG.arm(self.budget_s)
        try:
            try:
                result = self.fn(*args)
            finally:
                fired = WATCHDOG.disarm(call)
        except HookBudgetExceeded:
            WATCHDOG.disarm(call)
            raise self._over_budget(args) from None
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            if call.fired:
                raise self._over_budget(args) from None
            raise self._failed(args, exc) from exc
        if fired:  # it returned (swallowing the interruption) after its budget ran out
            raise self._over_budget(args)
        return result

    def _failed(self, args: tuple[Any, ...], exc: BaseException) -> PolicyError:
        if isinstance(exc, SystemExit):
            what = f"called sys.exit({exc.code!r}) (a policy hook may not end the run)"
        elif isinstance(exc, exit_trap.HookExitAttempt):
            what = f"called {exc.what} {_NO_EXIT}"
        elif isinstance(exc, PolicyError):
            what = str(exc)
        else:
            what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return PolicyError(f"{self._where(args)}: {what}")
