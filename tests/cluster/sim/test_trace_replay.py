"""Trace replay in the simulator: a trace with arrival times is replayed once at those times
and the run ends when its last request finishes; `trace_cycle` makes the loop of agents cycle
it instead; a trace without times keeps feeding the closed loop once (cluster/sim/orchestrator.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster.core import ConfigError
from cluster.sim.simulator import SimConfig, Simulator

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "traces"
SMALL = dict(nodes=4, split="2P2D", planner="static", profile="h200", telemetry="compact")


def _mooncake(path: Path, n: int = 30, every_ms: int = 500) -> Path:
    """n single-turn requests, one every `every_ms`, sharing their first 512-token block."""
    with path.open("w") as f:
        for i in range(n):
            rec = {
                "timestamp": i * every_ms,
                "input_length": 1200 + 10 * i,
                "output_length": 20 + i,
                "hash_ids": [0, 1000 + 2 * i, 1001 + 2 * i],
            }
            f.write(json.dumps(rec) + "\n")
    return path


def _azure(path: Path, n: int = 25) -> Path:
    lines = ["arrived_at,num_prefill_tokens,num_decode_tokens"]
    lines += [f"{0.8 * i:.3f},{900 + 7 * i},{15 + i}" for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _run(workload: Path | str, **kw: object) -> tuple[Simulator, dict]:
    cfg = SimConfig(workload=str(workload), **(SMALL | {"duration_s": 600.0, "warmup_s": 5.0} | kw))
    sim = Simulator(cfg)
    return sim, sim.run()


@pytest.mark.parametrize("make", [_mooncake, _azure], ids=["mooncake-jsonl", "azure-csv"])
def test_a_timestamped_trace_replays_each_request_once_at_its_time(tmp_path, make):
    trace = make(tmp_path / ("t.jsonl" if make is _mooncake else "t.csv"))
    total = len(trace.read_text().strip().splitlines()) - (make is _azure)
    sim, s = _run(trace, agents=126)  # the closed loop's default must not add programs
    assert s["programs_finished"] == total
    assert len(sim.requests) == total  # no call beyond the trace's own
    assert len({r.program for r in sim.requests}) == total  # each program once
    assert (s["trace_replay"], s["trace_requests"], s["trace_requests_served"]) == (
        "arrivals", total, total,
    )  # fmt: skip
    assert s["trace_cycled"] is False and s["trace_finished"] is True
    # The run ends when the last request finishes, not at --duration.
    last = max(r.t_done for r in sim.requests if r.t_done is not None)
    assert s["sim_seconds"] == pytest.approx(last) and last < 600.0
    # Requests arrive at their recorded times.
    first_turns = sorted(r.t_arrival for r in sim.requests)
    step = 0.5 if make is _mooncake else 0.8
    assert first_turns == pytest.approx([step * i for i in range(total)])


def test_the_bundled_mooncake_slice_is_served_once():
    """The 300-request fixture, at the CLI's defaults but a shorter warmup: 300 of 300."""
    trace = FIXTURES / "mooncake_conversation_head300.jsonl"
    cfg = SimConfig(workload=str(trace), duration_s=3600.0, warmup_s=17.0)
    sim = Simulator(cfg)
    s = sim.run()
    assert s["trace_requests"] == s["trace_requests_served"] == s["programs_finished"] == 300
    assert s["trace_cycled"] is False and s["trace_finished"] is True
    assert s["sim_seconds"] < 200.0 and s["requests"] > 200  # measured after the 17 s warmup


def test_a_trace_ending_after_the_duration_stops_at_the_duration(tmp_path):
    trace = _mooncake(tmp_path / "t.jsonl", n=40, every_ms=1000)  # arrivals up to 39 s
    sim, s = _run(trace, duration_s=20.0, warmup_s=2.0)
    assert s["sim_seconds"] == 20.0 and s["trace_finished"] is False
    assert s["trace_requests"] == 40 and s["trace_requests_served"] < 21
    assert len({r.program for r in sim.requests}) <= 20  # arrivals after 20 s never came


def test_cycle_makes_the_agents_loop_over_the_trace(tmp_path):
    trace = _mooncake(tmp_path / "t.jsonl", n=10)
    sim, s = _run(trace, trace_cycle=True, agents=6, duration_s=120.0)
    assert s["trace_replay"] == "closed" and s["trace_cycled"] is True
    assert s["trace_finished"] is False and s["sim_seconds"] == 120.0
    assert s["trace_requests"] == 10 and s["trace_requests_served"] > 10
    # Repeats carry the round in their program id (fresh private content).
    assert any("~" in r.program for r in sim.requests)


def test_a_trace_without_times_still_feeds_the_closed_loop_once():
    trace = FIXTURES / "sweagent_turns_slice.jsonl"
    sim, s = _run(trace, agents=2, duration_s=900.0, workload_params={"run": "bs1"})
    turns = s["trace_requests"]
    assert s["trace_replay"] == "closed" and s["trace_cycled"] is False
    assert s["trace_finished"] is False and s["sim_seconds"] == 900.0
    assert 0 < s["trace_requests_served"] <= turns
    assert len({r.program for r in sim.requests}) <= len(sim.source.trace_programs())


def test_cycle_needs_a_trace():
    with pytest.raises(ConfigError, match="needs a trace workload"):
        Simulator(SimConfig(workload="cc", trace_cycle=True, **SMALL))


def test_generators_carry_no_trace_fields():
    _, s = _run("putnam", agents=4, duration_s=60.0)
    assert not [k for k in s if k.startswith("trace_")]


def test_a_paced_replay_ends_when_the_trace_is_served(tmp_path):
    """The live server's simulated cluster says the run ended, and why, once the trace is."""
    import time

    from cluster.sim.paced import PaceConfig, PacedSimulation

    trace = _mooncake(tmp_path / "t.jsonl", n=8, every_ms=200)
    cfg = SimConfig(workload=str(trace), duration_s=86_400.0, warmup_s=0.0, **SMALL)
    engines = PacedSimulation(cfg, None, PaceConfig(speed=200.0))
    engines.start()
    try:
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline:
            with engines.control_plane.lock:  # type: ignore[union-attr]
                why = engines.ended()
            if why is not None:
                break
            time.sleep(0.05)
        assert why is not None and "every trace request finished" in why
        with engines.control_plane.lock:  # type: ignore[union-attr]
            t_end, lag = engines.now(), engines.lag_s
        time.sleep(0.3)
        assert engines.now() == t_end < 60.0  # the clock no longer moves
        assert lag == 0.0 and engines.error is None
    finally:
        summary = engines.stop()
    assert summary is not None and summary["trace_requests_served"] == 8
    assert summary["trace_finished"] is True
