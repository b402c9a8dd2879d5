"""The aggregated closed loop (`uniform_engine`, `closed_loop`) against the twin's `StepScheduler`.

The reference below drives the engine model's own scheduler (one `EngineRequest` per
request, `BlockPool` blocks) through the same benchmark: clients at t = 0, each sending its
next request just after the previous completes, every iteration priced by the same rule.
The aggregated engine must give the same mean TTFT and TPOT (vLLM's mixed chunked prefill,
SGLang's prefill-first, whole prompts only), and a PD pair must add its transfer time.
"""

from __future__ import annotations

import pytest

from cluster.sim.engine_model.block_pool import BlockPool
from cluster.sim.engine_model.closed_loop import REPLY_S, BenchmarkProtocol, Worker, closed_loop
from cluster.sim.engine_model.scheduler import StepScheduler
from cluster.sim.engine_model.sequence import EngineRequest
from cluster.sim.engine_model.uniform_engine import EngineLimits, UniformEngine


def price(chunks: list[tuple[int, int]], decodes: int, mean_ctx: float, group: float) -> float:
    """An iteration: a floor, GEMMs by tokens, attention by context and by query-key pairs."""
    tokens = decodes + sum(n for n, _ in chunks)
    pairs = sum(n * c + n * (n + 1) / 2 for n, c in chunks)
    return 2e-3 + 4e-6 * tokens + 2e-8 * decodes * mean_ctx + 1e-10 * pairs


def reference(c: int, isl: list[int], osl: list[int], lim: EngineLimits) -> tuple[float, float]:
    """The same benchmark on StepScheduler, one request object per request."""
    sched = StepScheduler(
        BlockPool(lim.kv_blocks, lim.block_size), lim.max_num_seqs, lim.max_num_batched_tokens,
        enable_chunked_prefill=lim.chunked, mixed_prefill_decode=lim.mixed,
    )  # fmt: skip
    pending: list[tuple[float, EngineRequest]] = []
    issued, done, t = 0, [], 0.0

    def send(at: float) -> None:
        nonlocal issued
        if issued < len(isl):
            pending.append((at, EngineRequest(str(issued), at, isl[issued], osl[issued])))
            issued += 1

    for _ in range(c):
        send(0.0)
    while len(done) < len(isl):
        for item in [p for p in pending if p[0] <= t]:
            pending.remove(item)
            sched.add(item[1])
        if sched.idle:
            t = min(p[0] for p in pending)
            continue
        b = sched.schedule()
        dec = b.decode_kv
        t += price(b.prefill_chunks, len(dec), sum(dec) / len(dec) if dec else 0.0, 0.0)
        for r in sched.finish(b, t):
            done.append(r)
            send(t + REPLY_S)
    ttft = sum(r.first_token_s - r.arrival_s for r in done) / len(done)
    tpot = sum((r.done_s - r.first_token_s) / (r.output_tokens - 1) for r in done) / len(done)
    return ttft, tpot


@pytest.mark.parametrize(
    ("mixed", "chunked", "c", "ratio"),
    [(True, True, 6, 1.0), (True, True, 16, 0.8), (False, True, 8, 0.8), (True, False, 5, 0.8)],
)
def test_aggregated_engine_matches_the_step_scheduler(
    mixed: bool, chunked: bool, c: int, ratio: float
) -> None:
    lim = EngineLimits(64, 2048, 100_000, 16, mixed, chunked)
    proto = BenchmarkProtocol(requests_per_client=4, length_ratio=ratio, seed=3)
    isl, osl = proto.lengths(c * 4, 1500), proto.lengths(c * 4, 300)
    got = closed_loop(c, 1500, 300, [Worker([UniformEngine(lim)], price)], protocol=proto)
    want_ttft, want_tpot = reference(c, isl, osl, lim)
    assert got.requests == c * 4
    assert got.ttft_s == pytest.approx(want_ttft, rel=0.02)
    assert got.tpot_s == pytest.approx(want_tpot, rel=0.01)


def test_kv_pressure_preempts_and_slows_like_the_step_scheduler() -> None:
    # 12 clients of 2,000 tokens each need 1,500 blocks; 900 force recompute preemptions
    lim = EngineLimits(64, 2048, 900, 16)
    proto = BenchmarkProtocol(requests_per_client=3, length_ratio=1.0)
    got = closed_loop(12, 1000, 1000, [Worker([UniformEngine(lim)], price)], protocol=proto)
    want_ttft, want_tpot = reference(12, [1000] * 36, [1000] * 36, lim)
    roomy = closed_loop(
        12,
        1000,
        1000,
        [Worker([UniformEngine(EngineLimits(64, 2048, 10_000, 16))], price)],
        protocol=proto,
    )
    assert got.preemptions > 0 and roomy.preemptions == 0
    assert got.ttft_s > roomy.ttft_s
    # blocks are counted in aggregate (half a block per request), so close, not equal
    assert got.ttft_s == pytest.approx(want_ttft, rel=0.25)
    assert got.tpot_s == pytest.approx(want_tpot, rel=0.1)


def test_one_client_through_a_pd_pair_pays_prefill_transfer_then_decodes() -> None:
    lim = EngineLimits(64, 4096, 100_000, 16)
    pre = Worker([UniformEngine(lim, decode=False)], price)
    dec = Worker([UniformEngine(lim, prefill=False)], price)
    proto = BenchmarkProtocol(requests_per_client=3, length_ratio=1.0)
    got = closed_loop(1, 2000, 11, [pre], decode_workers=[dec], transfer_s=0.05, protocol=proto)
    assert got.ttft_s == pytest.approx(price([(2000, 0)], 0, 0.0, 0.0) + 0.05, rel=1e-6)
    # decode iterations read contexts 2001..2010: the mean of the linear price
    mean = sum(price([], 1, 2000.0 + g, 0.0) for g in range(1, 11)) / 10
    assert got.tpot_s == pytest.approx(mean, rel=1e-3)


def test_lockstep_dp_ranks_take_the_slowest_ranks_time() -> None:
    lim = EngineLimits(64, 2048, 100_000, 16)
    proto = BenchmarkProtocol(requests_per_client=2, length_ratio=1.0)
    one = closed_loop(4, 1000, 50, [Worker([UniformEngine(lim)], price)], protocol=proto)
    two = closed_loop(
        8, 1000, 50, [Worker([UniformEngine(lim), UniformEngine(lim)], price)], protocol=proto
    )
    assert two.tpot_s == pytest.approx(one.tpot_s, rel=1e-6)  # symmetric ranks: same pace
    assert two.requests == 2 * one.requests
