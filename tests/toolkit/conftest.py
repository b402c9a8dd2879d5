"""Helpers of the tests that start real processes: waiting, and checking processes ended."""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import psutil
import pytest


def wait_for(pred: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Poll `pred` until it returns something truthy (returned); fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.3)


def running(pids: list[int]) -> list[int]:
    """The pids of `pids` that still run (a zombie has ended)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def gone(pids: list[int], timeout_s: float = 10.0) -> bool:
    """True once none of `pids` runs, within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while running(pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


@pytest.fixture
def procs() -> SimpleNamespace:
    """`wait_for`, `running` and `gone` for the tests of this directory."""
    return SimpleNamespace(wait_for=wait_for, running=running, gone=gone)
