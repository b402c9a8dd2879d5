"""Packed turns (`TurnTable`) are the same program as the Turn objects they were packed from."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.workloads import make_workload
from cluster.workloads.program import Program, Turn
from cluster.workloads.turn_table import PACK_MIN_TURNS, TurnTable, pack_turns, root_turns


def _programs(name: str, seed: int, n: int) -> list[Program]:
    src = make_workload(name, seed=seed)
    return [src.next_program(0.0) for _ in range(n)]


def _graph(turns: tuple[Turn, ...]) -> tuple[list[int], list[list[int]], set[int | None]]:
    succ: list[list[int]] = [[] for _ in turns]
    for i, t in enumerate(turns):
        for d in t.deps:
            succ[d].append(i)
    forks = {t.parent_turn for t in turns if t.kind == "fork"}
    return [len(t.deps) for t in turns], succ, forks


@settings(max_examples=15, deadline=None)
@given(name=st.sampled_from(["cc", "osworld", "putnam", "shift"]), seed=st.integers(0, 2**16))
def test_a_packed_program_reads_back_as_the_turns_it_was_packed_from(name: str, seed: int) -> None:
    for p in _programs(name, seed, 3):
        turns = tuple(p.turns)  # materialized from the table (or the tuple itself)
        table = TurnTable(turns)
        assert len(table) == len(turns)
        assert list(table) == list(turns) and table == turns
        assert [table[i] for i in range(-len(turns), 0)] == list(turns)
        assert table[1:4] == turns[1:4]
        counts, succ, forks = _graph(turns)
        assert table.dep_counts() == counts
        s = table.successors()
        assert len(s) == len(turns) and [list(s[i]) for i in range(len(turns))] == succ
        assert table.fork_parents() == forks
        assert root_turns(table) == root_turns(turns) == [i for i, c in enumerate(counts) if c == 0]
        for i in range(len(turns)):
            assert list(table.deps(i)) == list(turns[i].deps)


def test_long_programs_are_packed_and_short_ones_stay_tuples() -> None:
    (cc,) = _programs("cc", 7, 1)
    assert isinstance(cc.turns, TurnTable) and len(cc.turns) > PACK_MIN_TURNS
    short = tuple(cc.turns)[:PACK_MIN_TURNS]
    assert isinstance(pack_turns(short), tuple)
    assert Program(cc.program_id, cc.workload, tuple(cc.turns)) == cc  # equal either way


def test_a_packed_program_is_checked_like_a_tuple_one() -> None:
    (cc,) = _programs("cc", 3, 1)
    turns = list(cc.turns)
    bad = turns[5]
    turns[5] = Turn(bad.branch_id, bad.kind, bad.append, bad.output_tokens, bad.output_seg,
                    (9,), bad.gap_s, tool=bad.tool)  # fmt: skip
    with pytest.raises(ValueError, match=r"turn 5: deps \(9,\) must precede it"):
        Program(cc.program_id, cc.workload, tuple(turns))
    with pytest.raises(ValueError, match=r"turn 5: deps \(9,\) must precede it"):
        Program(cc.program_id, cc.workload, TurnTable(turns))
    with pytest.raises(IndexError, match="out of range"):
        TurnTable(turns)[len(turns)]


def test_a_finishing_turn_is_the_turn_with_its_branch_finished() -> None:
    from dataclasses import fields, replace

    for t in _programs("cc", 5, 1)[0].turns:
        assert t.finishing() == replace(t, finishes_branch=True)
    assert [f.name for f in fields(Turn)][-1] == "finishes_branch"
