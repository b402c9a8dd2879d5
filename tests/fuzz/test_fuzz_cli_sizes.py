"""Every count and size a user can type has a ceiling checked before allocation (issue 28).

A property over the simulation options (`SimConfig`: simulate, sweep, serve, lab share it):
any value is either within its ceiling (cluster.size_limits) or refused by `validate()`
before anything is built. Then the commands themselves, in-process: a refused size is one
`error:` line with exit 2. The probe's cases run as a user runs them, in a subprocess with
its address space capped: `pdlab serve --agents 100000000` grew to 22 GB and ignored SIGTERM;
`serve --port 70000` printed an OverflowError traceback.
"""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
from fuzz_cli import ROOT, RSS_CAP_MB, cli, one_line_error, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster import size_limits as limits
from cluster.core import ConfigError
from cluster.sim.config import SimConfig
from toolkit.client import free_port

SIZES: dict[str, limits.Limit] = {
    "nodes": limits.NODES,
    "agents": limits.AGENTS,
    "max_active": limits.MAX_ACTIVE,
    "duration_s": limits.SIM_SECONDS,
    "l1_tokens": limits.KV_TOKENS,
    "l2_tokens": limits.KV_TOKENS,
    "max_num_seqs": limits.MAX_NUM_SEQS,
    "max_num_batched_tokens": limits.BATCHED_TOKENS,
    "max_programs": limits.MAX_PROGRAMS,
    "window_s": limits.SIM_SECONDS,
    "relaunch_s": limits.SIM_SECONDS,
}
values = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, 1, 10**8, 10**9, 2**63, 4096, 4097, 100_000, 100_001]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e300, -1e15, 1e7, 1e7 + 1]),
)


@settings(max_examples=400, deadline=None)
@given(field=st.sampled_from(sorted(SIZES)), value=values)
def test_sim_config_sizes_are_within_ceilings_or_refused(field: str, value: Any) -> None:
    base: dict[str, Any] = {"nodes": 4096, "split": "collocated"} if field == "agents" else {}
    if field == "duration_s":
        base["warmup_s"] = 0.0
    cfg = SimConfig(**(base | {field: value}))
    try:
        cfg.validate()
    except (ConfigError, TypeError) as exc:
        assert "\n" not in str(exc)
        return
    limit = SIZES[field]
    assert isinstance(value, int | float) and math.isfinite(value), value
    assert limit.lo <= value <= limit.hi, (field, value)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["simulate", "--agents", "100000000"], "--agents must be at most"),
        (["simulate", "--agents", "20000", "--nodes", "9"], "1,000 per node"),
        (["simulate", "--nodes", "100000", "--split", "collocated"], "--nodes must be at most 4,096"),
        (["simulate", "--duration", "1e300"], "--duration must be at most"),
        (["simulate", "--arrival-rate", "inf"], "--arrival-rate"),
        (["simulate", "--max-num-seqs", "100000000"], "--max-num-seqs must be at most"),
        (["simulate", "--l1-tokens", "1000000000000000000"], "--l1-tokens must be at most"),
        (["simulate", "--gpu-memory-gib", "1e9"], "--gpu-memory-gib must be at most"),
        (["simulate", "--partitions", "1000000"], "--partitions must be at most"),
        (["sweep", "--base", "duration_s=60", "--random", "stagger_s=uniform:1:2",
          "--samples", "1000000000"], "the sweep's runs"),
        (["serve", "--agents", "100000000"], "--agents must be at most"),
        (["serve", "--port", "70000"], "--port must be at most 65,535"),
        (["serve", "--engines", "torch", "--nodes", "1000"], "--nodes must be at most 64"),
        (["lab", "--lab-port", "70000"], "--lab-port must be at most 65,535"),
        (["advise", "x.duckdb", "--seeds", "1000000"], "--seeds must be at most"),
        (["synth-logs", "x.duckdb", "--iterations", "1000000000000"], "--iterations must be at most"),
    ],
)  # fmt: skip
def test_probe_sizes_are_refused_in_one_line(args: list[str], words: str) -> None:
    code, out = cli(*args)
    one_line_error(code, out, words)


def test_probe_serve_with_a_hundred_million_agents_is_refused_before_allocation() -> None:
    """It grew to 22 GB, ignored SIGTERM and was killed by the kernel's OOM killer."""
    res = run_cli("serve", "--agents", "100000000", "--port", str(free_port()))
    one_line_error(res.code, res.err, "--agents must be at most")
    assert res.peak_rss_mb < RSS_CAP_MB and res.seconds < 30, res


def test_probe_serve_port_70000_is_one_line() -> None:
    res = run_cli("serve", "--port", "70000")
    one_line_error(res.code, res.err, "--port must be at most 65,535")


def test_sigterm_ends_serve_at_its_largest_agent_count() -> None:
    """At the ceiling of agents for its nodes (1,000 per node), SIGTERM still ends the run
    (stored, summarized) and the process; a hang or an OOM would fail here."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolkit.cli", "serve", "--port", str(port), "--nodes", "2",
         "--split", "1P1D", "--agents", "2000", "--speed", "50"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "pdlab serve: URL token=..." once it is about to serve
        assert "pdlab serve:" in line, line
        time.sleep(1.5)  # the agents start and queue
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode in (0, -signal.SIGTERM), out[-2000:]
    assert "Traceback" not in out and "requests" in out, out[-2000:]
