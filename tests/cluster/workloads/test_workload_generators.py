"""Synthetic agent workloads: determinism, structure and calibration to papers 000/003.

Calibration targets (see each generator's docstring): cc ideal prefix hit ~95-97% (TraceLab
95.7%, paper 000 Table C.1 ~97.4%), ~98% of the prompt reusable after a sub-agent call and
~14% after a compaction (paper 000 Fig. 2(c)), tool calls > 1 min ~4% of calls and ~85% of the
time (paper 003 §1); putnam decode-heavy single branch (h* ~ 99%); osworld prefill-heavy with a
screenshot per step (h* ~ 94%).
"""

import heapq
from dataclasses import fields

import numpy as np
import pytest

from cluster.core import ConfigError
from cluster.workloads import WORKLOAD_PARAMS, WORKLOADS, WorkloadSource, make_workload
from cluster.workloads.analysis import (
    check_disjoint,
    check_program,
    contexts,
    request_stats,
    summarize,
)
from cluster.workloads.program import SHARED_SEGMENT_LIMIT
from cluster.workloads.shift import lifetime_s
from cluster.workloads.source import CC_SYSTEM, CC_TOOLS

N_PROGRAMS = {"putnam": 300, "cc": 120, "osworld": 150}


@pytest.fixture(scope="module")
def sampled():
    out = {}
    for name, n in N_PROGRAMS.items():
        src = make_workload(name, seed=0)
        out[name] = [src.next_program(float(i)) for i in range(n)]
    return out


@pytest.fixture(scope="module")
def stats(sampled):
    return {name: request_stats(progs) for name, progs in sampled.items()}


@pytest.fixture(scope="module")
def summaries(sampled):
    return {name: summarize(progs) for name, progs in sampled.items()}


# -- API, determinism, structure ----------------------------------------------------------


def test_registry_and_protocol():
    assert WORKLOADS.names() == ["cc", "osworld", "putnam", "shift"]
    for name in WORKLOADS:
        src = make_workload(name, seed=1)
        assert isinstance(src, WorkloadSource)
        assert src.name == name
        assert src.trace_programs() is None
        assert src.recorded_concurrency is None and src.recorded_turn_times is None
        assert isinstance(src.params, WORKLOAD_PARAMS[name])


@pytest.mark.parametrize("name", ["putnam", "cc", "osworld", "shift"])
def test_same_seed_same_programs(name):
    a = make_workload(name, seed=7, duration_s=300.0)
    b = make_workload(name, seed=7, duration_s=300.0)
    c = make_workload(name, seed=8, duration_s=300.0)
    times = [0.0, 50.0, 120.0, 150.0, 299.0]
    pa = [a.next_program(t) for t in times]
    assert pa == [b.next_program(t) for t in times]
    assert pa != [c.next_program(t) for t in times]
    assert len({p.program_id for p in pa}) == len(pa)


def test_program_shape_does_not_depend_on_call_time():
    a, b = make_workload("cc", seed=3), make_workload("cc", seed=3)
    assert a.next_program(0.0) == b.next_program(12_345.0)


def test_program_ids_are_sequential_and_named():
    src = make_workload("cc", seed=0)
    assert [src.next_program(0.0).program_id for _ in range(3)] == [
        "cc-000000",
        "cc-000001",
        "cc-000002",
    ]


@pytest.mark.parametrize("name", ["putnam", "cc", "osworld"])
def test_programs_are_structurally_valid(name, sampled):
    progs = sampled[name]
    for p in progs:
        check_program(p)  # deps precede, branches finish, fork parents valid, ...
        assert p.workload == name and p.arrival_s is None
        for t in p.turns:
            for s in t.append:  # shared ids only for the workload's fixed shared content
                assert s.seg_id >= SHARED_SEGMENT_LIMIT or s.seg_id < 100
    check_disjoint(progs)  # no private id is used by two programs
    outs = [t.output_seg for p in progs for t in p.turns]
    assert len(set(outs)) == len(outs)


def test_bad_params_raise_config_errors_naming_them():
    with pytest.raises(ConfigError, match=r"unknown workload 'nope'.*cc, osworld, putnam, shift"):
        make_workload("nope")
    with pytest.raises(ConfigError, match=r"'burst_rate'.*allowed:.*burst_prob"):
        make_workload("cc", burst_rate=0.1)
    with pytest.raises(ConfigError, match="burst_prob"):
        make_workload("cc", burst_prob=1.5)
    with pytest.raises(ConfigError, match="'system_tokens' must be an integer"):
        make_workload("putnam", system_tokens=2.5)
    with pytest.raises(ConfigError, match="'steps' must be of type TokenDist"):
        make_workload("putnam", steps=10)
    with pytest.raises(ConfigError, match="seed"):
        make_workload("putnam", seed=-1)
    with pytest.raises(ConfigError, match="duration_s"):
        make_workload("cc", duration_s=0)
    # numbers given as strings (CLI) are accepted
    assert make_workload("cc", burst_prob="0.05").params.burst_prob == 0.05
    custom = make_workload("cc", burst_sizes=[2, 3], burst_weights=[1, 1])
    assert custom.params.burst_sizes == (2, 3)
    with pytest.raises(ConfigError, match="burst_weights"):
        make_workload("cc", burst_sizes=[2, 3])


def test_every_param_is_documented_with_a_default():
    for cls in WORKLOAD_PARAMS.values():
        default = cls()
        for f in fields(cls):
            assert getattr(default, f.name) is not None, f"{cls.__name__}.{f.name}"


# -- cc -------------------------------------------------------------------------------------


def test_cc_ideal_hit_rate(summaries):
    # TraceLab global prefix hit 95.7%; paper 000 CC h* ~ 97.4%
    assert 0.94 <= summaries["cc"].ideal_hit_rate <= 0.975


def test_cc_subagent_bursts_join_with_98_percent_reuse(sampled, stats):
    joins = [s for s in stats["cc"] if s.branch_id == "root" and s.joins > 0]
    assert len(joins) >= 50
    assert all(s.tool == "subagent" for s in joins)
    assert 0.965 <= float(np.median([s.reuse for s in joins])) <= 0.995
    # structure: every sub-agent of a burst is joined by the root's next turn
    for p in sampled["cc"]:
        spawn_of = {t.branch_id: t.deps[0] for t in p.turns if t.kind == "subagent"}
        last_of = {t.branch_id: i for i, t in enumerate(p.turns) if t.finishes_branch}
        for branch, spawn in spawn_of.items():
            assert p.turns[spawn].branch_id == "root"
            joiner = next(i for i, t in enumerate(p.turns) if t.branch_id == "root" and i > spawn)
            assert last_of[branch] in p.turns[joiner].deps
    bursts = [
        sum(1 for t in p.turns if t.kind == "subagent" and t.deps[0] == s)
        for p in sampled["cc"]
        for s in {t.deps[0] for t in p.turns if t.kind == "subagent"}
    ]
    assert max(bursts) >= 3 and np.mean(bursts) > 1.5  # several sub-agents at once


def test_cc_compaction_keeps_only_the_shared_prefix(sampled, stats):
    compacts = [s for s in stats["cc"] if s.kind == "compact"]
    assert len(compacts) >= 30
    assert 0.10 <= float(np.median([s.reuse for s in compacts])) <= 0.18
    for p in sampled["cc"]:
        ctx = contexts(p)
        for i, t in enumerate(p.turns):
            if t.kind == "compact":
                assert t.compact_keep == 2 and t.tool == "compact"
                assert [s.seg_id for s in ctx[i][:2]] == [CC_SYSTEM, CC_TOOLS]
                # the turn before is the summarization request on the full history
                prev = p.turns[i - 1]
                assert prev.branch_id == "root" and sum(s.tokens for s in ctx[i - 1]) > 90_000


def test_cc_has_forks_and_gap_tail(sampled, summaries):
    kinds = {t.kind for p in sampled["cc"] for t in p.turns}
    assert kinds == {"start", "append", "fork", "subagent", "compact"}
    s = summaries["cc"]
    assert s.top5_gap_share >= 0.75  # a small share of gaps holds most pause time
    assert 0.02 <= s.long_gap_share <= 0.06  # TraceLab: calls > 1 min are 4% ...
    assert 0.75 <= s.long_gap_time_share <= 0.95  # ... and 85% of the time
    tools = {t.tool for p in sampled["cc"] for t in p.turns}
    assert {
        "bash",
        "read",
        "edit",
        "search",
        "user",
        "subagent",
        "spawn",
        "compact",
        "fork",
    } <= tools
    user_gaps = [t.gap_s for p in sampled["cc"] for t in p.turns if t.tool == "user"]
    assert 100 <= float(np.median(user_gaps)) <= 250  # Copilot: median 172 s between turns


# -- putnam and osworld ------------------------------------------------------------------


def test_putnam_is_one_decode_heavy_branch(sampled, summaries):
    for p in sampled["putnam"]:
        assert {t.branch_id for t in p.turns} == {"root"}
        assert {t.kind for t in p.turns} <= {"start", "append"}
        assert {t.tool for t in p.turns[1:]} <= {"lean", "bash"}
        assert sum(s.tokens for s in contexts(p)[-1]) <= 131_072
    s = summaries["putnam"]
    assert 0.97 <= s.ideal_hit_rate <= 0.995  # paper 000 Table C.1: ~99%
    # Decode-heavy: more output than uncached input per request (~0.9K output, calibrated
    # to paper 000's Putnam throughput on the gb300 profile).
    assert s.output_tokens > 600 and s.output_tokens > s.uncached_tokens


def test_osworld_appends_a_screenshot_every_step_and_drops_old_ones(sampled):
    p_ = make_workload("osworld").params
    for p in sampled["osworld"]:
        shots = {t.append[-1].seg_id for t in p.turns}  # every turn ends with its new screenshot
        for t in p.turns:
            assert 1_500 <= t.append[-1].tokens <= 3_000
        for t, ctx in zip(p.turns, contexts(p), strict=True):
            held = sum(1 for s in ctx if s.seg_id in shots)
            assert held <= p_.keep_images + p_.image_removal_chunk - 1
            if t.kind == "compact":
                assert held == p_.keep_images  # dropped in whole chunks down to the limit
    assert any(t.kind == "compact" for p in sampled["osworld"] for t in p.turns)
    assert any(t.kind == "subagent" for p in sampled["osworld"] for t in p.turns)  # multi-agent


def test_prefill_vs_decode_heaviness(summaries):
    pu, cc, os_ = summaries["putnam"], summaries["cc"], summaries["osworld"]
    # decode work per uncached prefill token: Putnam far above OSWorld
    assert pu.output_tokens / pu.uncached_tokens > 1.0
    assert os_.output_tokens / os_.uncached_tokens < 0.15
    assert pu.output_tokens / pu.uncached_tokens > 10 * os_.output_tokens / os_.uncached_tokens
    # OSWorld prefills the most new tokens per request
    assert os_.uncached_tokens > cc.uncached_tokens > 0
    assert os_.uncached_tokens > pu.uncached_tokens
    assert 0.90 <= os_.ideal_hit_rate <= 0.96  # paper 000 Table C.1: ~94%
    # pause per request of a few seconds for Putnam and OSWorld (paper 000 App. D.1 throughput)
    assert 2.0 <= pu.gap_s <= 8.0 and 2.0 <= os_.gap_s <= 8.0


# -- shift --------------------------------------------------------------------------------


def test_shift_follows_the_three_periods():
    src = make_workload("shift", seed=0, duration_s=3_000.0, warmup_s=300.0)
    assert src.period(0.0) == 0 and src.period(1_199.0) == 0
    assert src.period(1_200.0) == 1 and src.period(2_099.0) == 1
    assert src.period(2_100.0) == 2 and src.period(10_000.0) == 2
    assert [src.target_concurrency(t) for t in (0.0, 1_500.0, 2_500.0)] == [288, 216, 144]
    kinds0 = {src.next_program(t).workload for t in np.linspace(0, 1_199, 30)}
    mixed = [src.next_program(t) for t in np.linspace(1_200, 2_099, 90)]
    kinds2 = {src.next_program(t).workload for t in np.linspace(2_100, 2_999, 30)}
    assert kinds0 == {"putnam"} and kinds2 == {"osworld"}
    # issued programs hold the share weighted by estimated lifetime (exactly, up to one program)
    life = {
        k: sum(lifetime_s(p, 20.0) for p in mixed if p.workload == k) for k in ("putnam", "osworld")
    }
    assert life["putnam"] / (life["putnam"] + life["osworld"]) == pytest.approx(2 / 3, abs=0.02)
    assert sum(p.workload == "putnam" for p in mixed) > 60  # Putnam agents live shorter
    check_disjoint(mixed)  # putnam and osworld programs draw ids from one allocator
    with pytest.raises(ConfigError, match="duration_s"):
        make_workload("shift", duration_s=100.0, warmup_s=200.0)


def test_shift_mixed_period_holds_two_to_one_live_agents_in_a_closed_loop():
    """A closed loop of 40 agents in the mixed period: finished agents are replaced at once.
    Actual lifetimes use 25 s per request (the source assumes 20 s)."""
    src = make_workload("shift", seed=0, duration_s=3 * 20_000.0)
    t0, t1 = 20_000.0, 40_000.0
    events = []
    for k in range(40):
        p = src.next_program(t0)
        heapq.heappush(events, (t0 + lifetime_s(p, 25.0), k, p.workload))
    seq, now, last, time_in = 40, t0, t0, {"putnam": 0.0, "osworld": 0.0}
    live = {"putnam": 0, "osworld": 0}
    for _, _, w in events:
        live[w] += 1
    while now < t1:
        now, _, w = heapq.heappop(events)
        if now > t0 + 5_000:  # after burn-in, time-average the live composition
            for kind in live:
                time_in[kind] += live[kind] * (now - last)
        last = now
        live[w] -= 1
        p = src.next_program(now)
        live[p.workload] += 1
        seq += 1
        heapq.heappush(events, (now + lifetime_s(p, 25.0), seq, p.workload))
    share = time_in["putnam"] / (time_in["putnam"] + time_in["osworld"])
    assert share == pytest.approx(2 / 3, abs=0.06)
