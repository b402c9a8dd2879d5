"""User policy hooks fail loudly and within a time budget (cluster.policies.guard).

An exception, `sys.exit` or a hook that never returns ends the run with a `PolicyError`
naming the policy, the hook and the simulated time; an infinite loop is stopped on the main
thread (by a signal) and off it (by an asynchronous exception).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from cluster.core import ConfigError
from cluster.policies import PolicyError, ProgramControlBlock, load_policy

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.timeout(180)

POLICIES = """
import sys, time
from cluster.policies import SchedulingPolicy

class Raises(SchedulingPolicy):
    def priority(self, pcb, now):
        raise ValueError("bad value in user hook")

class Exits(SchedulingPolicy):
    def priority(self, pcb, now):
        sys.exit(0)

class Loops(SchedulingPolicy):
    def priority(self, pcb, now):
        while True:
            pass

class Sleeps(SchedulingPolicy):
    def priority(self, pcb, now):
        time.sleep(3600)

class CatchesAll(SchedulingPolicy):
    def priority(self, pcb, now):
        while True:
            try:
                while True:
                    pass
            except Exception:  # the interruption is not an Exception: it gets through
                pass

class Swallows(SchedulingPolicy):
    def priority(self, pcb, now):
        try:
            while True:
                pass
        except BaseException:
            return 0.0  # returns normally, but after its budget ran out

class Interrupted(SchedulingPolicy):
    def priority(self, pcb, now):
        raise KeyboardInterrupt

class Fine(SchedulingPolicy):
    def priority(self, pcb, now):
        return now
"""


@pytest.fixture
def policies(tmp_path: Path) -> Path:
    path = tmp_path / "hooks.py"
    path.write_text(textwrap.dedent(POLICIES))
    return path


def _call(path: Path, name: str, budget: float | None = 0.3, now: float = 42.5) -> None:
    hook = load_policy("scheduling", f"{path}:{name}", hook_budget_s=budget).hooks["priority"]
    hook(ProgramControlBlock("p", "w", 0.0), now)


def test_failures_name_policy_hook_and_time(policies: Path) -> None:
    with pytest.raises(
        PolicyError,
        match=r"^scheduling policy 'Raises', hook priority at t=42\.500 s: "
        r"ValueError: bad value in user hook$",
    ):
        _call(policies, "Raises")
    with pytest.raises(PolicyError, match=r"hook priority at t=42\.500 s: called sys\.exit\(0\)"):
        _call(policies, "Exits")
    with pytest.raises(KeyboardInterrupt):  # the user stopping the run is not a policy failure
        _call(policies, "Interrupted")


@pytest.mark.parametrize("name", ["Loops", "Sleeps", "CatchesAll", "Swallows"])
def test_a_hook_past_its_budget_is_stopped_on_the_main_thread(policies: Path, name: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(PolicyError, match=r"'" + name + r"', hook priority .*budget of 0\.3 s"):
        _call(policies, name)
    assert time.monotonic() - t0 < 5.0
    _call(policies, "Fine")  # the guard is reusable after a stop


@pytest.mark.parametrize("name", ["Loops", "CatchesAll", "Swallows"])
def test_a_hook_past_its_budget_is_stopped_off_the_main_thread(policies: Path, name: str) -> None:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            _call(policies, name)
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(10.0)
    assert not worker.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], PolicyError), errors
    assert "budget of 0.3 s" in str(errors[0])


def test_budget_is_validated_and_can_be_off(policies: Path) -> None:
    with pytest.raises(ConfigError, match="hook_budget_s must be"):
        _call(policies, "Fine", budget=0)
    _call(policies, "Fine", budget=None)
    with pytest.raises(PolicyError, match="ValueError"):
        _call(policies, "Raises", budget=None)


def _simulate(policy: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = ["simulate", "--nodes", "2", "--split", "1P1D", "--agents", "2", "--duration", "60",
            "--warmup", "0", "--planner", "static", "--scheduling", policy, "--db",
            str(tmp_path / "p.duckdb")]  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "toolkit.cli", *args],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("Raises", "hook priority at t=0.000 s: ValueError: bad value in user hook"),
        ("Exits", "hook priority at t=0.000 s: called sys.exit(0)"),
        ("Loops", "ran longer than its budget of 10 s"),
    ],
)
def test_simulate_ends_with_one_line_naming_the_hook(
    policies: Path, tmp_path: Path, name: str, words: str
) -> None:
    res = _simulate(f"{policies}:{name}", tmp_path)
    err = " ".join(res.stderr.split())
    assert res.returncode == 2, (res.stdout, res.stderr)  # sys.exit(0) no longer ends it with 0
    assert "Traceback" not in res.stderr and words in err, res.stderr
    assert f"scheduling policy '{name}'" in err


EXITS_HARD = """
import os
from cluster.policies import SchedulingPolicy

class HardExit(SchedulingPolicy):
    def priority(self, pcb, now):
        os._exit(0)

class HardExitCaught(SchedulingPolicy):
    def priority(self, pcb, now):
        try:
            os._exit(3)
        except BaseException:
            return 0.0

class Aborts(SchedulingPolicy):
    def priority(self, pcb, now):
        os.abort()
"""


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("HardExit", "hook priority at t=0.000 s: called os._exit(0)"),
        ("HardExitCaught", "hook priority at t=0.000 s: called os._exit(3)"),
        ("Aborts", "hook priority at t=0.000 s: called os.abort()"),
    ],
)
def test_a_hook_that_ends_the_process_fails_the_run_instead(
    tmp_path: Path, name: str, words: str
) -> None:
    """os._exit(0) in a hook ended `pdlab simulate` with exit 0 and no output (issue 28)."""
    path = tmp_path / "hard.py"
    path.write_text(textwrap.dedent(EXITS_HARD))
    res = _simulate(f"{path}:{name}", tmp_path)
    err = " ".join(res.stderr.split())
    assert res.returncode == 2, (res.returncode, res.stdout[-500:], res.stderr[-2000:])
    assert "Traceback" not in res.stderr and words in err, res.stderr
    assert "may not end the process" in err and f"scheduling policy '{name}'" in err


def test_os_exit_outside_hooks_still_exits(tmp_path: Path) -> None:
    """The trap only acts inside a guarded hook: a worker's own os._exit is untouched."""
    code = (
        "import os\nfrom cluster.policies import load_policy\n"
        "load_policy('scheduling', 'fcfs')\nos._exit(7)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", code], env=env, timeout=60)
    assert res.returncode == 7
