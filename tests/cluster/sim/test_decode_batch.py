"""A node's decode batch as a clock and columns (cluster/sim/decode_batch.py) gives what the
request-by-request computation gives: every request's remaining iterations, the fewest in
the batch, the finishers in batch order and the epoch's total context as the same float,
both under random joins, preemptions and advances (hypothesis) and for every epoch of
simulated runs with joins, cuts, preemptions and mixed iterations."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.core import MemorySink
from cluster.sim.decode_batch import DecodeBatch, batch_context
from cluster.sim.entities import ProgramRun, SimRequest
from cluster.sim.node import SimNode
from cluster.sim.simulator import SimConfig, Simulator
from cluster.workloads.program import Program, Segment, Turn

TURN = Turn("root", "start", (Segment(1, 1000),), 11, 2)
RUN = ProgramRun(Program("p", "cc", (TURN,)), 0, 0.0)


def _request(i: int, t_in: int, t_out: int, left: int) -> SimRequest:
    r = SimRequest(f"p/{i}", RUN, 0, "p/root", [1], t_in, t_out, 0.0, 0)
    r.decode_left = left
    return r


def _reference_context(batch: list[SimRequest], left: dict[str, int], t_acc: float) -> float:
    """decode.py's sum before the columns, over independently counted remaining iterations."""
    return float(sum(r.t_in + (r.t_out - 1 - left[r.request_id] * t_acc) for r in batch))


# An op: ("join", t_in, t_out, left), ("leave", index), ("rejoin", index): a request that
# left joins again (with the same finish clock when no advance came between) or
# ("advance", iterations).
OPS = st.one_of(
    st.tuples(
        st.just("join"),
        st.integers(1, 200_000),
        st.integers(2, 30_000),
        st.integers(1, 3_000),
    ),
    st.tuples(st.just("leave"), st.integers(0, 10_000)),
    st.tuples(st.just("rejoin"), st.integers(0, 10_000)),
    st.tuples(st.just("advance"), st.integers(1, 400)),
)
T_ACC = st.one_of(st.sampled_from([1.0, 1.7, 2.0, 3.2]), st.floats(0.05, 8.0))


@settings(max_examples=300, deadline=None)
@given(t_acc=T_ACC, start=st.integers(0, 3), ops=st.lists(OPS, max_size=60))
def test_columns_match_the_request_by_request_bookkeeping(t_acc, start, ops):
    left: dict[str, int] = {}  # the model: remaining iterations, counted one by one
    requests = [_request(i, 1000 + 7 * i, 300 + i, 50 + 13 * i) for i in range(start)]
    for r in requests:
        left[r.request_id] = r.decode_left
    db = DecodeBatch(list(requests))
    out: list[SimRequest] = []  # requests that left the batch
    for i, op in enumerate(ops):
        if op[0] == "join":
            r = _request(start + i, op[1], op[2], op[3])
            left[r.request_id] = op[3]
            db.join([r])
        elif op[0] == "leave" and db.reqs:
            r = db.reqs[op[1] % len(db.reqs)]
            db.leave(r)
            out.append(r)
        elif op[0] == "rejoin" and any(left[r.request_id] > 0 for r in out):
            waiting = [r for r in out if left[r.request_id] > 0]
            r = waiting[op[1] % len(waiting)]
            out.remove(r)
            db.join([r])
        elif op[0] == "advance":
            before = list(db.reqs)
            for r in before:
                left[r.request_id] -= op[1]
            finished = db.advance(op[1])
            assert finished == [r for r in before if left[r.request_id] <= 0]
            assert db.reqs == [r for r in before if left[r.request_id] > 0]
            out.extend(finished)
        for r in db.reqs + out:
            assert r.decode_left == left[r.request_id]
        assert all(r.decode_clock is None for r in out)
        assert len(set(map(id, db.reqs + out))) == len(db.reqs) + len(out)
        if db.reqs:
            assert db.min_left() == min(left[r.request_id] for r in db.reqs)
        ctx = db.context(t_acc)
        ref = _reference_context(db.reqs, left, t_acc)
        assert ctx == ref and ctx == batch_context(db.reqs, t_acc), (ctx, ref)


def test_a_request_in_a_batch_refuses_a_direct_change_and_keeps_its_count_outside():
    r = _request(0, 1000, 300, 40)
    db = DecodeBatch([])
    db.join([r])
    db.advance(15)
    assert r.decode_left == 25
    with pytest.raises(RuntimeError, match="advances only with its batch's clock"):
        r.decode_left = 3
    db.leave(r)  # preempted: it keeps 25 and may be set again
    assert r.decode_left == 25 and r.decode_clock is None and not db.reqs
    db.advance(100)
    assert r.decode_left == 25
    r.decode_left = 7
    assert r.decode_left == 7


def test_a_replaced_batch_list_is_rebuilt_keeping_every_count():
    reqs = [_request(i, 1000, 300, 10 + i) for i in range(4)]
    node = SimNode(0, "decode", None)  # type: ignore[arg-type]  # memory is not read here
    sim = Simulator(SimConfig(nodes=2, split="1P1D", agents=1, duration_s=2.0, warmup_s=1.0))
    stage = sim.engine.decode
    stage.batch(node).join(reqs)
    stage.batch(node).advance(5)
    node.decode_batch = reqs[1:3]  # replaced from outside
    db = stage.batch(node)
    assert db.reqs is node.decode_batch
    assert [r.decode_left for r in reqs] == [5, 6, 7, 8]
    assert db.min_left() == 6
    assert db.advance(6) == [reqs[1]]
    assert [r.decode_left for r in reqs] == [5, 0, 1, 8]  # those outside stay put


# ---- every epoch of simulated runs ---------------------------------------------------------


class EpochChecker:
    """Wraps a simulator's decode and mixed stages: counts each request's remaining
    iterations one by one, as the code before the columns did, and checks every epoch's
    k, total context (the same float) and finishers (in batch order) against them."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.t_acc = sim.profile.t_acc
        self.left: dict[int, int] = {}  # id(request) -> remaining iterations
        self.epochs = self.cuts = self.mixed = self.preempted = 0
        self.done: list[SimRequest] = []
        stage = sim.engine.decode
        self.stage = stage
        self._start, self._end, self._done = stage.start_epoch, stage.end, stage.done
        self._cut = stage.cut_epoch
        stage.start_epoch = self.start_epoch  # type: ignore[method-assign]
        stage.end = self.end  # type: ignore[method-assign]
        stage.done = self.on_done
        stage.cut_epoch = self.cut_epoch  # type: ignore[method-assign]
        self._mixed_end = sim.engine.mixed.end
        sim.engine.mixed.end = self.mixed_end  # type: ignore[method-assign]

    def _count(self, batch: list[SimRequest]) -> None:
        for r in batch:
            if id(r) not in self.left:  # joined for the first time: the engine's count
                self.left[id(r)] = math.ceil((r.t_out - 1) / self.t_acc)
            assert r.decode_left == self.left[id(r)]

    def on_done(self, node: SimNode, r: SimRequest) -> None:
        self.done.append(r)
        self._done(node, r)

    def cut_epoch(self, node: SimNode) -> None:
        self.cuts += 1
        self._cut(node)

    def start_epoch(self, node: SimNode) -> None:
        before = list(node.decode_batch)
        self._count(before)
        k0 = max(1, min(min(self.left[id(r)] for r in before), 1024))
        self._start(node)
        e = node.epoch
        assert e is not None
        self.epochs += 1
        self.preempted += len(before) - len(e.batch)
        for r in before:  # the preempted keep their count
            assert r.decode_left == self.left[id(r)]
        ref = float(sum(r.t_in + (r.t_out - 1 - self.left[id(r)] * self.t_acc) for r in e.batch))
        assert e.ctx0 == ref, (e.ctx0, ref)
        k = len(e.ends)
        if type(node.memory).__name__ == "TieredMemory" and not node.memory.paged:  # type: ignore[attr-defined]
            assert k == k0
        else:  # the memory may shorten the epoch to what fits
            assert 1 <= k <= k0

    def _advanced(self, node: SimNode, batch: list[SimRequest], n: int, call: Any) -> None:
        self._count(batch)  # a mixed iteration's decodes may not have run an epoch yet
        for r in batch:
            self.left[id(r)] -= n
        self.done.clear()
        call()
        finished = [r for r in batch if self.left[id(r)] <= 0]
        assert [r for r in self.done if r in batch] == finished
        for r in batch:
            assert r.decode_left == self.left[id(r)]
            assert (r in node.decode_batch) == (self.left[id(r)] > 0) or r.recompute

    def end(self, node: SimNode, token: int) -> None:
        e = node.epoch
        if e is None or e.token != token:
            self._end(node, token)  # a cut epoch's first end: ignored
            return
        self._advanced(node, list(e.batch), len(e.ends), lambda: self._end(node, token))

    def mixed_end(self, node: SimNode, chunks: list[Any], decodes: list[SimRequest]) -> None:
        self.mixed += bool(decodes)
        self._advanced(node, decodes, 1, lambda: self._mixed_end(node, chunks, decodes))

    def finish(self) -> None:
        finished = 0
        for r in self.sim.requests:
            if id(r) in self.left:
                assert r.decode_left == self.left[id(r)]
                if r.t_done is not None:  # the run may end with requests decoding
                    assert r.decode_left <= 0 and r.decode_clock is None
                    finished += 1
        assert finished > 50


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """60 single-turn requests 50 ms apart with outputs of 240-318 tokens."""
    path = tmp_path_factory.mktemp("epochs") / "t.jsonl"
    with path.open("w") as f:
        for i in range(60):
            rec = {
                "timestamp": 50 * i,
                "input_length": 1000 + 37 * i,
                "output_length": 240 + 13 * (i % 7),
                "hash_ids": [10 * i, 10 * i + 1],
            }
            f.write(json.dumps(rec) + "\n")
    return path


LIMITED = dict(planner="static", duration_s=600.0, warmup_s=0.1, agents=1)
CASES: dict[str, dict[str, Any]] = {
    # PD nodes, whole-output KV: joins cut epochs, no preemption (gb300: t_acc 1.7)
    "pd": dict(
        workload="cc", nodes=4, split="2P2D", agents=12, duration_s=300, warmup_s=60,
        planner="static", seed=3,
    ),
    # engine limits: paged KV preempts the newest decode, recomputed on its node (t_acc 3.2)
    "paged_preemption": dict(
        nodes=3, split="1P2D", profile="h200", max_num_seqs=16, l1_tokens=5000, **LIMITED
    ),
    # a collocated node with limits: mixed iterations and decode epochs, preemptions
    "mixed": dict(
        nodes=1, split="collocated", max_num_seqs=8, max_num_batched_tokens=1024,
        l1_tokens=9000, **LIMITED
    ),
    # one GPU pool, no host tier: under FCFS the last to join is preempted under pressure
    "unified_pool": dict(
        workload="cc", nodes=2, split="collocated", agents=16, duration_s=300, warmup_s=30,
        planner="static", host_kv=False, l1_tokens=60000, retention="lru", seed=2,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_epoch_matches_the_request_by_request_bookkeeping(name, trace):
    kw = {"workload": str(trace)} | CASES[name]
    sim = Simulator(SimConfig(telemetry="compact", **kw), sink=MemorySink())
    check = EpochChecker(sim)
    s = sim.run()
    check.finish()
    assert check.epochs > 50 and s["requests"] > 50
    if name != "mixed":  # joins cut epochs (on the collocated node, mixed iterations run)
        assert check.cuts > 50
    if name != "pd":
        assert check.preempted > 0
    if name == "mixed":
        assert check.mixed > 100
