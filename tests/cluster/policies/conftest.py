"""Small simulator configurations shared by the policy-plane tests."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cluster.sim.simulator import SimConfig

FIXTURES = Path(__file__).parents[2] / "fixtures"
SWE_SLICE = FIXTURES / "traces" / "sweagent_turns_slice.jsonl"


def _pressure_config(**kw: object) -> SimConfig:
    """One collocated engine, one GPU KV pool (no host tier), cc agents under pressure."""
    base = SimConfig(
        workload="cc",
        nodes=1,
        split="collocated",
        agents=6,
        duration_s=300,
        warmup_s=0,
        planner="static",
        host_kv=False,
        l1_tokens=120_000,
        seed=3,
    )
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


@pytest.fixture
def pressure_config():
    """Factory: `pressure_config(**overrides)` -> SimConfig (see `_pressure_config`)."""
    return _pressure_config


@pytest.fixture
def peeking_policy_file(tmp_path: Path) -> Path:
    """A retention policy that reads a future output length."""
    path = tmp_path / "peek.py"
    path.write_text(
        "from cluster.policies import RetentionPolicy, protect\n\n"
        "class PeekingRetention(RetentionPolicy):\n"
        "    def on_turn_complete(self, pcb, now):\n"
        "        # Cheating: how long will the next answer be?\n"
        "        return protect(now + pcb.output_tokens / 100.0)\n"
    )
    return path
