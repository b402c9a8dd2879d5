"""Trace replay (cluster/workloads/traces.py) on the committed fixtures (tests/fixtures/traces).

The full traces under ../shared/data/traces are checked too, but only where they exist.
"""

import json
from pathlib import Path

import pytest

from cluster.core import ConfigError
from cluster.workloads import WorkloadSource, make_workload
from cluster.workloads.analysis import check_disjoint, check_program, contexts, ideal_hit_rate
from cluster.workloads.continuum import estimate_tokens
from cluster.workloads.program import SHARED_SEGMENT_LIMIT
from cluster.workloads.source import TRACE_BLOCK_BASE
from cluster.workloads.traces import data_dir, open_text, resolve_trace_path, sniff

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "traces"
SWE = FIXTURES / "sweagent_turns_slice.jsonl"
MOONCAKE = FIXTURES / "mooncake_conversation_head300.jsonl"
AZURE = FIXTURES / "azure_code_head200.csv"


def _rows(path: Path) -> list[dict]:
    with open_text(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _ctx_tokens(program) -> list[int]:
    return [sum(s.tokens for s in c) for c in contexts(program)]


def test_sniff_formats(tmp_path):
    assert sniff(SWE) == "sweagent" and sniff(MOONCAKE) == "mooncake" and sniff(AZURE) == "azure"
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"foo": 1}\n')
    with pytest.raises(ConfigError, match="unrecognised trace"):
        make_workload(str(bad))
    badcsv = tmp_path / "x.csv"
    badcsv.write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match="arrived_at"):
        make_workload(str(badcsv))
    with pytest.raises(ConfigError, match="not found"):
        make_workload(str(tmp_path / "missing.jsonl"))


def test_sweagent_programs_conserve_recorded_input_tokens():
    src = make_workload(str(SWE))  # default run bs32
    assert isinstance(src, WorkloadSource)
    assert src.recorded_concurrency == 32 and src.target_concurrency(0.0) == 32
    progs = src.trace_programs()
    assert [p.program_id for p in progs] == [
        "bs32/django__django-13925",
        "bs32/django__django-15388",
    ]
    rows = {(r["run"], r["instance"], r["step"]): r for r in _rows(SWE)}
    for p in progs:
        check_program(p)
        assert p.arrival_s is None  # closed loop at the recorded concurrency
        run, instance = p.program_id.split("/")
        recorded = [rows[(run, instance, k + 1)] for k in range(len(p.turns))]
        assert _ctx_tokens(p) == [
            r["input_tokens"] for r in recorded
        ]  # every turn, compactions too
        assert [t.output_tokens for t in p.turns] == [r["output_tokens"] for r in recorded]
        for k, t in enumerate(p.turns[1:], 1):
            assert t.gap_s == pytest.approx(recorded[k]["llm_enter"] - recorded[k - 1]["llm_exit"])
            assert t.tool == "bash"
        for k, r in enumerate(recorded):
            assert src.recorded_turn_times[(p.program_id, k)] == (
                r["prefill_time_s"],
                r["decode_time_s"],
            )
    check_disjoint(progs)


def test_sweagent_shrinking_context_becomes_a_compact_turn():
    src = make_workload(str(SWE), run="bs32")
    assert src.report.num_compactions == 1
    (prog,) = [p for p in src.trace_programs() if p.program_id.endswith("15388")]
    compacts = [i for i, t in enumerate(prog.turns) if t.kind == "compact"]
    assert compacts == [38]  # step 39: 32,572 + 6 -> 31,620 tokens
    t = prog.turns[38]
    assert t.compact_keep == 1  # the first prompt (system + task) survives
    assert _ctx_tokens(prog)[38] == 31_620


def test_sweagent_run_selection():
    bs1 = make_workload(str(SWE), run="bs1")
    assert bs1.recorded_concurrency == 1
    assert [p.program_id for p in bs1.trace_programs()] == ["bs1/django__django-14016"]
    assert make_workload(str(SWE), run="bs4").recorded_concurrency == 4
    with pytest.raises(ConfigError, match="'run' must be one of"):
        make_workload(str(SWE), run="bs8")


def test_mooncake_hash_blocks_are_shared_segments():
    src = make_workload(str(MOONCAKE))
    assert src.recorded_concurrency is None and src.report.num_block_fixes == 0
    progs = src.trace_programs()
    rows = _rows(MOONCAKE)
    assert len(progs) == len(rows) == 300
    seg_of: dict[int, object] = {}
    for p, r in zip(progs, rows, strict=True):
        check_program(p)
        assert p.arrival_s == pytest.approx(r["timestamp"] / 1000)
        (turn,) = p.turns
        assert turn.kind == "start" and turn.output_tokens == r["output_length"]
        assert turn.append_tokens == r["input_length"]
        assert [s.seg_id - TRACE_BLOCK_BASE for s in turn.append] == r["hash_ids"]
        for s, h in zip(turn.append, r["hash_ids"], strict=True):
            assert s.seg_id < SHARED_SEGMENT_LIMIT
            assert seg_of.setdefault(h, s) == s  # equal hash_id -> equal segment
        assert all(s.tokens == 512 for s in turn.append[:-1])
    assert seg_of[0] == progs[0].turns[0].append[0]  # block 0 opens every request
    check_disjoint(progs)


def test_mooncake_ideal_hit_rate_equals_hash_prefix_reuse():
    rows = _rows(MOONCAKE)
    seen: set[tuple[int, ...]] = set()
    hit = total = 0
    for r in rows:  # independent count on the raw hash_ids
        h = r["hash_ids"]
        n = 0
        while n < len(h) and tuple(h[: n + 1]) in seen:
            n += 1
        hit += 512 * n if n < len(h) else r["input_length"]
        total += r["input_length"]
        seen.update(tuple(h[: j + 1]) for j in range(len(h)))
    assert ideal_hit_rate(make_workload(str(MOONCAKE)).trace_programs()) == pytest.approx(
        hit / total
    )


def test_mooncake_inconsistent_blocks_are_repaired_and_counted(tmp_path):
    path = tmp_path / "mc.jsonl"
    recs = [
        {"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [1, 2]},  # ok
        {
            "timestamp": 10,
            "input_length": 600,
            "output_length": 5,
            "hash_ids": [1, 3, 4],
        },  # too many
        {"timestamp": 20, "input_length": 1500, "output_length": 5, "hash_ids": [1, 2]},  # too few
        {"timestamp": 30, "input_length": 700, "output_length": 0, "hash_ids": [1, 2]},  # 2 != 488
        {"timestamp": 40, "input_length": 0, "output_length": 1, "hash_ids": []},  # skipped
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    src = make_workload(str(path))
    progs = src.trace_programs()
    assert [p.turns[0].append_tokens for p in progs] == [1000, 600, 1500, 700]
    assert src.report.num_block_fixes == 3 and src.report.num_skipped == 1
    assert [s.seg_id - TRACE_BLOCK_BASE for s in progs[1].turns[0].append] == [1, 3]
    assert progs[2].turns[0].append[1] == progs[0].turns[0].append[1]  # shared block 2 (488)
    assert progs[2].turns[0].append[2].seg_id >= SHARED_SEGMENT_LIMIT  # excess kept private
    assert progs[3].turns[0].append[1].seg_id >= SHARED_SEGMENT_LIMIT  # 188-token "2" is not 2
    huge = tmp_path / "huge.jsonl"
    huge.write_text(
        json.dumps({"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1 << 20]})
    )
    with pytest.raises(ConfigError, match=r"huge\.jsonl:1: hash_ids: holds 1048576 \(allowed"):
        make_workload(str(huge))
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(recs[0]) + "\n{not json\n")
    with pytest.raises(ConfigError, match=r"broken\.jsonl:2"):
        make_workload(str(broken))


def test_azure_requests_are_unique_single_turn_programs():
    src = make_workload(str(AZURE), time_scale=0.5)
    progs = src.trace_programs()
    lines = AZURE.read_text().splitlines()[1:]
    assert len(progs) == len(lines) == 200
    for p, line in zip(progs, lines, strict=True):
        arrived, inp, out = line.split(",")
        assert p.arrival_s == pytest.approx(float(arrived) * 0.5)
        assert p.turns[0].append_tokens == int(inp) and p.turns[0].output_tokens == int(out)
    assert ideal_hit_rate(progs) == 0.0  # no prefix information


def test_next_program_replays_in_order_then_cycles_with_fresh_ids():
    src = make_workload(str(SWE), run="bs32", limit=1)
    first = src.next_program(0.0)
    again = src.next_program(0.0)
    assert (
        first.program_id == "bs32/django__django-13925"
        and again.program_id == first.program_id + "~1"
    )
    assert _ctx_tokens(first) == _ctx_tokens(again)
    check_disjoint([first, again])  # a repeat does not hit the first pass's KV
    once = make_workload(str(AZURE), cycle=False, limit=2)
    once.next_program(0.0), once.next_program(0.0)
    with pytest.raises(ConfigError, match="only 2 programs"):
        once.next_program(0.0)


def test_relative_paths_resolve_under_the_data_dir(monkeypatch):
    monkeypatch.setenv("PDLAB_DATA_DIR", str(FIXTURES.parent))
    assert data_dir() == FIXTURES.parent
    src = make_workload("traces/azure_code_head200.csv")
    assert src.report.num_programs == 200
    assert make_workload("azure_code_head200.csv").report.path == str(AZURE)


# The full traces: ../shared/data when present, else the copies bundled with pdlab.
SWEAGENT_FULL = resolve_trace_path("thunderagent_sweagent_glm45fp8_h200_turns.jsonl")


def test_full_sweagent_trace():
    for run, n in (("bs1", 5), ("bs4", 64), ("bs32", 64)):
        src = make_workload(str(SWEAGENT_FULL), run=run)
        assert src.report.num_programs == n
    rows = [r for r in _rows(SWEAGENT_FULL) if r["run"] == "bs32"]
    assert src.report.num_turns == len(rows) and src.report.num_compactions == 1
    by = {(r["instance"], r["step"]): r["input_tokens"] for r in rows}
    for p in src.trace_programs():
        inst = p.program_id.split("/")[1]
        assert _ctx_tokens(p) == [by[(inst, k + 1)] for k in range(len(p.turns))]


def test_full_mooncake_trace():
    src = make_workload("mooncake_fast25_conversation_trace.jsonl")
    assert src.report.num_programs == 12_031 and src.report.num_block_fixes == 0


CONTINUUM = FIXTURES / "continuum_swesmith_head2x13.json"


def test_continuum_trajectories_become_programs_with_tool_timings():
    src = make_workload(str(CONTINUUM))
    assert src.format == "continuum"
    progs = src.trace_programs()
    raw = json.loads(CONTINUUM.read_text())
    assert len(progs) == 2
    for p, traj in zip(progs, raw, strict=True):
        check_program(p)
        msgs = json.loads(traj["messages"])
        actions = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
        assert len(p.turns) == len(actions) == 6
        ctx = _ctx_tokens(p)
        for k, i in enumerate(actions):
            assert ctx[k] == sum(estimate_tokens(m) for m in msgs[:i])  # prompt = all before it
            assert p.turns[k].output_tokens == estimate_tokens(msgs[i])
            if k:
                call = msgs[actions[k - 1]]["tool_calls"][0]
                assert p.turns[k].gap_s == pytest.approx(call["execution_time_seconds"])
                assert p.turns[k].tool == call["function"]["name"]
    # the identical system prompt is one shared segment
    assert progs[0].turns[0].append[0] == progs[1].turns[0].append[0]
    assert progs[0].turns[0].append[0].seg_id < SHARED_SEGMENT_LIMIT
    check_disjoint(progs)


def test_trace_last_arrival_is_none_without_arrival_times():
    from cluster.workloads import trace_last_arrival_s

    assert trace_last_arrival_s(FIXTURES / "mooncake_conversation_head300.jsonl") == 102.0
    assert trace_last_arrival_s(FIXTURES / "mooncake_conversation_head300.jsonl", limit=10) == 0.0
    assert trace_last_arrival_s(FIXTURES / "sweagent_turns_slice.jsonl") is None
    assert trace_last_arrival_s("cc") is None
