"""The engine model's limits: batch size, token budget, KV blocks and preemption."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.core import ConfigError
from cluster.hardware.engine import EngineSettings
from cluster.sim.engine_model import (
    BlockPool,
    ReplayRequest,
    ScheduledBatch,
    StepScheduler,
    replay_engine,
)
from cluster.sim.engine_model.replay import replay
from cluster.sim.engine_model.sequence import EngineRequest


def _flat(batch: ScheduledBatch) -> float:
    return 0.01  # every iteration 10 ms: the tests look at order, not time


def _sched(blocks: int = 1000, seqs: int = 8, budget: int = 64, bs: int = 4) -> StepScheduler:
    return StepScheduler(BlockPool(blocks, bs), seqs, budget)


def test_max_num_seqs_queues_the_rest() -> None:
    s = _sched(seqs=3, budget=1000)
    reqs = [EngineRequest(f"r{i}", 0.0, 10, 50) for i in range(5)]
    for r in reqs:
        s.add(r)
    b = s.schedule()
    assert [r.request_id for r, _ in b.entries] == ["r0", "r1", "r2"]
    assert [r.request_id for r in s.waiting] == ["r3", "r4"]
    s.finish(b, 0.01)
    b = s.schedule()  # three decodes; still no room for r3
    assert b.decode_kv == [11, 11, 11] and len(s.waiting) == 2
    s.check_invariants()
    out = replay_engine(
        0,
        [ReplayRequest(f"q{i}", 0.0, 10, 50) for i in range(5)],
        _sched(seqs=3, budget=1000),
        _flat,
    )
    first = sorted(r.first_token_s or 0 for r in out.requests)
    # the two queued requests get their first token only after a running one finished
    assert first[3] > 0.4 and max(r.done_s or 0 for r in out.requests) > first[3]


def test_token_budget_chunks_a_long_prompt_among_decodes() -> None:
    s = _sched(budget=64)
    a = EngineRequest("a", 0.0, 8, 100)
    s.add(a)
    s.finish(s.schedule(), 0.01)  # a prefills in one chunk and decodes from now on
    long = EngineRequest("long", 0.0, 200, 5)
    s.add(long)
    chunks = []
    while long.first_token_s is None:
        b = s.schedule()
        assert b.num_tokens <= 64
        assert b.decode_kv, "the running decode rides in every iteration"
        chunks.append(b.prefill_chunks)
        s.finish(b, 0.01 * (len(chunks) + 1))
    # 63 tokens per chunk (one budget token goes to a's decode), over the cached prefix
    assert chunks == [[(63, 0)], [(63, 63)], [(63, 126)], [(11, 189)]]


def test_kv_exhaustion_preempts_the_newest_and_everyone_finishes() -> None:
    # 12 blocks of 4 tokens: three requests of 8 + 12 tokens cannot all keep growing
    s = _sched(blocks=12, bs=4, seqs=8, budget=64)
    s.reserve_full_prompt = False
    reqs = [EngineRequest(f"r{i}", 0.0, 8, 13) for i in range(3)]
    for r in reqs:
        s.add(r)
    t = 0.0
    victims = []
    while not all(r.finished for r in reqs):
        b = s.schedule()
        victims += [v.request_id for v in b.preempted]
        t += 0.01
        s.finish(b, t)
        s.check_invariants()
    assert victims and victims[0] == "r2"  # the newest running request goes first
    assert reqs[2].num_preemptions >= 1 and reqs[0].num_preemptions == 0
    assert all(r.generated_tokens == 13 for r in reqs)
    # a preempted request is recomputed: prompt plus what it had generated, as one prefill
    assert s.pool.free_blocks == 12


def test_no_admission_in_a_step_that_preempted() -> None:
    s = _sched(blocks=6, bs=4, seqs=8, budget=64)
    s.reserve_full_prompt = False
    a, b_ = EngineRequest("a", 0.0, 8, 20), EngineRequest("b", 0.0, 8, 20)
    s.add(a)
    s.add(b_)
    s.finish(s.schedule(), 0.01)  # both prefilled: 2 + 2 blocks, 2 free
    s.add(EngineRequest("c", 0.0, 4, 2))
    while True:
        batch = s.schedule()
        if batch.preempted:
            assert all(r.request_id != "c" for r, _ in batch.entries)
            break
        s.finish(batch, 0.02)


def test_reserve_full_prompt_waits_for_room() -> None:
    s = _sched(blocks=10, bs=4, budget=8)
    s.add(EngineRequest("a", 0.0, 20, 2))  # 5 blocks in all, 2 for the first chunk
    s.add(EngineRequest("b", 0.0, 24, 2))  # 6 blocks: not free while a holds its chunk
    b = s.schedule()
    assert [(r.request_id, n) for r, n in b.entries] == [("a", 8)]
    assert s.pool.free_blocks == 8


def test_request_larger_than_kv_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"needs 8 KV blocks .* engine 0 has 4"):
        replay_engine(0, [ReplayRequest("big", 0.0, 20, 10)], _sched(blocks=4), _flat)


def test_dp_ranks_are_independent_engines() -> None:
    eng = EngineSettings(max_num_seqs=1, max_num_batched_tokens=64, data_parallel_size=2)
    reqs = [ReplayRequest("a", 0.0, 8, 10, 0), ReplayRequest("b", 0.0, 8, 10, 1)]

    class Flat:
        shape = SimpleNamespace(is_moe=False)

        def time(self, chunks: object, decodes: object, group_tokens: float) -> float:
            return 0.01

    out = replay(reqs, eng, 100, Flat())  # type: ignore[arg-type]
    # one sequence per engine, yet both run at once: each on its own rank
    assert [e.requests[0].done_s for e in out] == pytest.approx([0.1, 0.1])
    with pytest.raises(ConfigError, match="data_parallel_size 2"):
        replay([ReplayRequest("c", 0.0, 8, 10, 5)], eng, 100, Flat())  # type: ignore[arg-type]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0, 0.5), st.integers(1, 60), st.integers(1, 30)),
        min_size=1,
        max_size=25,
    ),
    st.integers(16, 60),
    st.integers(1, 6),
    st.integers(8, 128),
    st.booleans(),
)
def test_random_workloads_finish_within_the_limits(
    specs: list[tuple[float, int, int]], blocks: int, seqs: int, budget: int, mixed: bool
) -> None:
    reqs = [ReplayRequest(f"r{i}", a, p, o) for i, (a, p, o) in enumerate(specs)]
    reqs = [r for r in reqs if -(-(r.prompt_tokens + r.output_tokens - 1) // 4) <= blocks]
    if not reqs:
        return
    s = _sched(blocks=blocks, bs=4, seqs=seqs, budget=budget)
    s.mixed_prefill_decode = mixed
    seen: list[ScheduledBatch] = []

    def price(b: ScheduledBatch) -> float:
        assert 0 < b.num_tokens <= budget and len(b.entries) <= seqs
        s.check_invariants()
        seen.append(b)
        return 0.01

    out = replay_engine(0, reqs, s, price)
    assert all(r.generated_tokens == r.output_tokens for r in out.requests)
    for r in out.requests:
        assert r.done_s is not None and r.first_token_s is not None
        assert r.arrival_s < r.first_token_s <= r.done_s
    assert s.pool.free_blocks == blocks and s.idle


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_a_preempted_requests_prefix_survives_until_evicted(prefix_caching: bool) -> None:
    pool = BlockPool(10, 4, prefix_caching=prefix_caching)
    a = EngineRequest("a", 0.0, 16, 5)
    assert pool.allocate(a, 16)
    a.computed_tokens = 16
    pool.free(a, preempted=True)
    a.reset_for_recompute()
    b = EngineRequest("b", 0.0, 28, 2)
    assert pool.allocate(b, 28)  # 7 blocks: the 6 never used, then a's tail block
    pool.check_invariants([b])
    if not prefix_caching:
        assert pool.cached_prefix_blocks(a) == 0
        return
    assert a.cached_blocks == 3 and pool.cached_prefix_blocks(a) == 3
    pool.take_cached(a, 3)
    assert (a.blocks, pool.free_blocks) == (3, 0)
    pool.check_invariants([a, b])


@pytest.mark.parametrize(("prefix_caching", "chunk"), [(True, (4, 12)), (False, (16, 0))])
def test_readmitted_request_computes_only_what_prefix_caching_lost(
    prefix_caching: bool, chunk: tuple[int, int]
) -> None:
    s = StepScheduler(BlockPool(10, 4, prefix_caching=prefix_caching), 8, 64)
    b = EngineRequest("b", 0.0, 12, 20, generated_tokens=4)
    assert s.pool.allocate(b, 16)
    b.computed_tokens = 16
    s.running.append(b)
    assert s._preempt_newest() is b and b.num_preemptions == 1
    batch = s.schedule()
    # 16 tokens of KV were kept; at least the last one is computed again, in whole blocks
    assert batch.prefill_chunks == [chunk]
    s.finish(batch, 1.0)
    assert b.generated_tokens == 5 and b.blocks == 4
    s.check_invariants()


def test_a_tiny_preempted_request_gives_up_its_cached_block() -> None:
    s = StepScheduler(BlockPool(4, 4), 8, 64)
    r = EngineRequest("r", 0.0, 2, 5, generated_tokens=1)  # 3 tokens: nothing to reuse
    assert s.pool.allocate(r, 3)
    r.computed_tokens = 3
    s.running.append(r)
    s._preempt_newest()
    assert s.schedule().prefill_chunks == [(3, 0)] and r.cached_blocks == 0
    s.check_invariants()


def test_dp_ranks_of_an_moe_model_with_ep_step_together() -> None:
    seen: list[float] = []

    class Moe:
        shape = SimpleNamespace(is_moe=True, num_layers=1)

        def time(self, chunks: list[tuple[int, int]], decodes: list[int], group: float) -> float:
            seen.append(group)
            return 0.01 if chunks else 0.001  # a prefill chunk is slow, a decode fast

        def cost(
            self, chunks: list[tuple[int, int]], decodes: list[int], group: float, _pad: object
        ) -> object:
            return SimpleNamespace(total=self.time(chunks, decodes, group))

        def dummy_cost(self, group: float, _pad: object) -> object:
            return SimpleNamespace(total=self.time([], [1], group))

        def outside_layers_time(self, tokens: float, seqs: float) -> float:
            return 0.0

    reqs = [ReplayRequest("long", 0.0, 4096, 2, 0), ReplayRequest("short", 0.0, 8, 10, 1)]
    done = {}
    for ep in (1, 2):
        eng = EngineSettings(
            max_num_seqs=4, max_num_batched_tokens=2048, data_parallel_size=2,
            expert_parallel_size=ep,
        )  # fmt: skip
        out = replay(reqs, eng, 1000, Moe())  # type: ignore[arg-type]
        done[ep] = {r.request_id: r.done_s for e in out for r in e.requests}
    # apart, the short request decodes at 1 ms; in step with the long prefill it waits for it
    assert done[1]["short"] == pytest.approx(0.01 + 9 * 0.001)
    assert done[2]["short"] == pytest.approx(0.01 + 0.01 + 8 * 0.001)
    assert done[2]["long"] == pytest.approx(done[1]["long"])
    assert 2048 + 8 in seen  # the EP group's tokens price the MoE layers
    # in step, the rank whose request finished runs vLLM's dummy batch (one token) beside
    # the other's decodes, and keeps stepping until the every-32-steps finish check
    e0, e1 = replay(reqs, eng, 1000, Moe())  # type: ignore[arg-type]
    assert e0.dummy_iterations > 0 and e1.dummy_iterations > 0 and 1 + 1 in seen
    assert (e0.num_iterations + e0.dummy_iterations) % 32 == 0


def test_prefill_first_runs_prefill_alone_then_decodes() -> None:
    s = _sched(budget=64)
    s.mixed_prefill_decode = False  # SGLang without --enable-mixed-chunk
    a = EngineRequest("a", 0.0, 8, 100)
    s.add(a)
    s.finish(s.schedule(), 0.01)
    long = EngineRequest("long", 0.0, 200, 5)
    s.add(long)
    kinds = []
    while long.first_token_s is None:
        b = s.schedule()
        kinds.append((b.prefill_chunks, b.decode_kv))
        s.finish(b, 0.01 * (len(kinds) + 1))
    # four prefill-only chunks of the whole budget; a waits instead of riding along
    assert kinds == [([(64, 0)], []), ([(64, 64)], []), ([(64, 128)], []), ([(8, 192)], [])]
    b = s.schedule()
    assert b.prefill_chunks == [] and len(b.decode_kv) == 2
