"""`summarize` reads a plain `RunRecord`: the warmup window, latency and KV metrics."""

from __future__ import annotations

import dataclasses
import math

import pytest

from cluster.sim.config import SimConfig
from cluster.sim.entities import ProgramRun, SimRequest
from cluster.sim.metrics import RunRecord, summarize
from cluster.workloads.program import Program, Segment, Turn


def _call(run: ProgramRun, i: int, arrival: float, first: float, done: float) -> SimRequest:
    r = SimRequest(f"p/{i}", run, i, "p/root", [1, 2], 1000, 11, arrival, 600)
    r.t_routed, r.t_prefill_start, r.t_first_token, r.t_done = arrival, arrival + 1, first, done
    r.t_c = 500
    r.measured = arrival >= 10.0
    return r


def _record(**kw: object) -> RunRecord:
    turn = Turn("root", "start", (Segment(1, 1000),), 11, 2)
    run = ProgramRun(Program("p", "cc", (turn, turn)), 0, 0.0)
    calls = [
        _call(run, 0, 5.0, 6.0, 8.0),  # arrived in the warmup: not measured
        _call(run, 1, 20.0, 22.0, 30.0),
        _call(run, 2, 40.0, 41.0, 46.0),
    ]
    base = RunRecord(
        config=SimConfig(duration_s=110.0, warmup_s=10.0),
        run_id="r1",
        profile="gb300",
        kv_fetch="async",
        sim_seconds=110.0,
        wall_seconds=2.0,
        events=123,
        requests=calls,
        queue_wait={0: [1.0, 3.0], 1: []},
        split=(4, 5),
        collocated=False,
        split_timeline=[(0.0, 4, 5)],
        switch_log=[{"node_id": 0, "t_done": 50.0, "to": "decode"}],
        switch_rows=[{"node_id": 0, "t_decided": 45.0, "t_done": 50.0, "to": "decode"}],
        program_rows=[(5.0, 30.0, 2, 1, 9.0), (20.0, 60.0, 2, 0, 9.0)],
        finished_programs=2,
        preemptions=3,
        retention=None,
        scheduling="fcfs",
        dispatch=None,
    )
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def test_summary_of_a_record():
    s = summarize(_record())
    assert s["requests"] == 2 and s["run_id"] == "r1" and s["events"] == 123
    assert s["mean_ttft_s"] == pytest.approx((2.0 + 1.0) / 2)
    assert s["mean_e2e_s"] == pytest.approx((10.0 + 6.0) / 2)
    assert s["throughput_rps"] == pytest.approx(2 / 100.0)  # finished in [10, 110]
    assert s["kv_hit_rate"] == pytest.approx(0.5) and s["lost_kv_reuse"] == pytest.approx(1 / 6)
    assert s["mean_tpot_s"] == pytest.approx((8.0 / 10 + 5.0 / 10) / 2)
    assert s["switches"] == 1 and s["mean_switch_time_s"] == 5.0 and s["final_split"] == "4P5D"
    assert s["programs_measured"] == 1 and s["mean_jct_s"] == 40.0  # arrived after warmup
    assert s["preemptions"] == 0 and s["preemptions_total"] == 3
    assert s["prefill_queue_wait_s"] == {"0": 2.0} and s["speedup"] == 55.0


def test_a_run_still_in_its_warmup_measures_nothing():
    s = summarize(_record(sim_seconds=8.0, collocated=True))
    assert s["measured_seconds"] == 0.0 and math.isnan(s["throughput_rps"])
    assert s["final_split"] == "collocated" and s["sim_seconds"] == 8.0
