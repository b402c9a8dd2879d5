"""Replay of the real SWE-agent turns at their recorded concurrency with a profile fitted
to their timings: simulated per-turn LLM times track the recorded ones on average."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cluster.core import ConfigError
from cluster.experiments.sweagent_replay import (
    TRACE,
    fit_sweagent_profile,
    replay_validation,
    trace_path,
)
from cluster.workloads.traces import resolve_trace_path

SLICE = "tests/fixtures/traces/sweagent_turns_slice.jsonl"


def _full_trace() -> str:
    """The full trace: ../shared/data, else the copy bundled with pdlab."""
    return str(resolve_trace_path(TRACE))


def test_fit_yields_a_valid_profile_with_sane_coefficients():
    fit = fit_sweagent_profile(str(trace_path()))
    p = fit.profile
    assert p.top_k == 8 and p.num_experts == 160 and p.t_acc == p.t_fwd == 1.0
    assert all(c >= 0 for c in (*p.prefill, *p.decode, p.decode_ctx_s_per_token))
    # bs1 time to first token is ~0.1-0.2 s, time per visible token at B = 1 tens of ms.
    assert 0.02 < p.prefill[0] < 0.3
    tpot_b1 = p.decode_times(1, np.array([25_000.0]))[0]
    assert 0.015 < float(tpot_b1) < 0.08
    assert 0 < fit.prefill_mape < 0.5


def test_replay_tracks_recorded_llm_times_on_the_full_trace():
    path = _full_trace()
    bounds = {"bs1": 0.2, "bs4": 0.15, "bs32": 0.1}
    for run, limit in (("bs1", 0), ("bs4", 12), ("bs32", 0)):
        r = replay_validation(run, path, limit=limit)
        assert r.turns > 150, run
        assert abs(r.mean_error) < bounds[run], r
        # Per turn the visible output under-counts generated tokens: errors are wide.
        assert 0.2 < r.mape < 0.8 and math.isfinite(r.p99_abs_error)
        assert abs(r.p99_error) < 0.25, r


def test_replay_on_the_bundled_slice_runs_every_recorded_turn():
    r = replay_validation("bs4", SLICE)
    assert r.turns == 38  # every turn of the slice's bs4 program completed
    assert abs(r.mean_error) < 0.25
    with pytest.raises(ConfigError, match="run must be one of"):
        replay_validation("bs8", SLICE)
