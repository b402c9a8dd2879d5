"""The cluster twin's engine model: vLLM's block-hash prefix cache, the shared CPU pool, the
round-robin front end, the PD split (TTFT includes the KV transfer), an MoE instance."""

from __future__ import annotations

import gzip
import json

import pytest

from cluster.data import BUNDLED
from cluster.hardware.layer_tables import load_layer_tables
from cluster.hardware.model_shape import ModelShape
from cluster.hardware.pricer import IterationPricer
from cluster.kv.hashing import token_block_hashes
from cluster.sim.engine_model.block_pool import BlockPool
from cluster.sim.engine_model.cluster_replay import ClusterRequest, Instance, replay_cluster
from cluster.sim.engine_model.prefix_pool import HashedBlockPool
from cluster.sim.engine_model.replay import batch_pricer
from cluster.sim.engine_model.scheduler import ScheduledBatch, StepScheduler
from cluster.sim.engine_model.sequence import EngineRequest
from cluster.sim.engine_model.shared_pool import SharedPrefixPool

A6000 = BUNDLED / "lss_ispass26_a6000"
STEP_S, PER_TOKEN_S = 0.01, 1e-5


def price(b: ScheduledBatch) -> float:
    return STEP_S + PER_TOKEN_S * b.num_tokens


def instance(role: str = "both", blocks: int = 1000, pc: bool = False, connector=None) -> Instance:  # type: ignore[no-untyped-def]
    pool = HashedBlockPool(blocks, 16) if pc else BlockPool(blocks, 16, prefix_caching=False)
    return Instance(role, StepScheduler(pool, 64, 512, connector=connector), price)


def request(i: int, arrival: float, ids: list[int], out: int) -> ClusterRequest:
    h = tuple(token_block_hashes(ids + list(range(10**6, 10**6 + out)), 16))
    return ClusterRequest(str(i), arrival, len(ids), out, h)


def test_a_later_request_hits_the_blocks_an_earlier_one_computed() -> None:
    pool = HashedBlockPool(20, 16)
    s = StepScheduler(pool, 8, 512)
    shared = list(range(48))  # 3 full blocks
    a = EngineRequest(
        "a", 0.0, 60, 2, block_hashes=tuple(token_block_hashes(shared + [1] * 30, 16))
    )
    b = EngineRequest(
        "b", 0.0, 50, 2, block_hashes=tuple(token_block_hashes(shared + [2] * 20, 16))
    )
    s.add(a)
    t = 0.0
    while not a.finished:
        t += 1
        s.finish(s.schedule(), t)
    assert pool.kv_blocks_in_use == 3  # a's full prompt blocks stay cached after it finished
    assert pool.used_blocks == 0
    s.add(b)
    batch = s.schedule()
    assert b.local_hit_tokens == 48 and batch.prefill_chunks == [(2, 48)]
    assert s.stats.queries == 110 and s.stats.local_hits == 48
    s.check_invariants()


def test_the_free_queue_evicts_a_finished_requests_tail_first() -> None:
    pool = HashedBlockPool(4, 4)
    s = StepScheduler(pool, 4, 64)
    a = EngineRequest("a", 0.0, 12, 1, block_hashes=tuple(token_block_hashes(list(range(13)), 4)))
    s.add(a)
    s.finish(s.schedule(), 1.0)
    assert pool.kv_blocks_in_use == 3
    # a new request needs 2 fresh blocks: the never-used one, then a's last block
    c = EngineRequest(
        "c", 0.0, 8, 1, block_hashes=tuple(token_block_hashes(list(range(100, 109)), 4))
    )
    s.add(c)
    s.schedule()
    assert pool.evictions == 1
    probe = EngineRequest("p", 0.0, 13, 1, block_hashes=a.block_hashes)
    assert pool.cached_prefix_blocks(probe) == 2  # a's first two blocks survived
    s.check_invariants()


def test_the_front_end_is_round_robin_in_arrival_order() -> None:
    reqs = [request(i, 0.1 * i, [i] * 40, 3) for i in range(6)]
    res = replay_cluster(reqs, [instance(), instance()])
    assert [r.instance for r in res.requests] == [0, 1, 0, 1, 0, 1]
    # least loaded: an idle instance 0 takes everything spaced out, busy ones spread
    least = replay_cluster(reqs, [instance(), instance()], frontend="least_loaded")
    assert {r.instance for r in least.requests} == {0}
    burst = [r._replace(arrival_s=0.001 * i) for i, r in enumerate(reqs)]
    least = replay_cluster(burst, [instance(), instance()], frontend="least_loaded")
    assert [r.instance for r in least.requests] == [0, 1, 0, 1, 0, 1]


def test_pd_ttft_includes_the_kv_transfer() -> None:
    reqs = [request(0, 0.0, list(range(1000)), 5)]
    colloc = replay_cluster(reqs, [instance()]).requests[0]
    bytes_per_token = 131072
    for gbps in (1.0, 100.0):
        xfer = 1000 * bytes_per_token / (gbps * 1e9)
        pd = replay_cluster(
            reqs, [instance("prefill"), instance("decode")],
            kv_transfer_s=lambda n, g=gbps: n * bytes_per_token / (g * 1e9),
        ).requests[0]  # fmt: skip
        # prefill (as collocated) + transfer + the decode instance's 1-token step
        assert pd.first_token_s == pytest.approx(colloc.first_token_s + xfer + STEP_S + PER_TOKEN_S)
        assert (pd.instance, pd.decode_instance) == (0, 1)
        assert pd.done_s - pd.first_token_s == pytest.approx(4 * (STEP_S + PER_TOKEN_S))
    with pytest.raises(ValueError, match="needs both a prefill and a decode"):
        replay_cluster(reqs, [instance("prefill")])


def _pulse(n: int) -> list[ClusterRequest]:
    with gzip.open(A6000 / "datasets" / "sharegpt_pulse_req50_n6_delay15_pc.jsonl.gz", "rt") as f:
        rows = [json.loads(x) for x in f][:n]
    return [
        ClusterRequest(str(i), r["arrival_time_ns"] / 1e9, r["input_toks"], r["output_toks"],
                       tuple(token_block_hashes(r["input_tok_ids"] + r["output_tok_ids"], 16)))
        for i, r in enumerate(rows)
    ]  # fmt: skip


def test_a_shared_pool_finds_prefixes_the_other_instance_computed() -> None:
    reqs = _pulse(150)  # three pulses of shared-prefix requests, real token ids

    def hits(pool: SharedPrefixPool | None) -> tuple[int, int]:
        res = replay_cluster(
            reqs, [instance(pc=True, connector=pool), instance(pc=True, connector=pool)], pool=pool
        )
        return sum(r.local_hit_tokens for r in res.requests), sum(
            r.external_hit_tokens for r in res.requests
        )

    local_alone, ext_alone = hits(None)
    pool = SharedPrefixPool(128e9, 128e9, 131072)
    local_shared, ext_shared = hits(pool)
    assert ext_alone == 0 and ext_shared > 0
    assert local_shared + ext_shared > local_alone  # sharing finds what round robin split
    assert pool.stored_chunks > 0 and pool.hits == ext_shared
    single = replay_cluster(reqs, [instance(pc=True)])
    assert sum(r.local_hit_tokens for r in single.requests) > local_alone  # one cache sees all


def test_an_moe_instance_replays_with_its_experts_priced() -> None:
    shape = ModelShape.load(A6000 / "models" / "microsoft/Phi-mini-MoE-instruct.json")
    pricer = IterationPricer(
        load_layer_tables(A6000 / "profiles/microsoft/Phi-mini-MoE-instruct/tp1", shape), shape
    )
    p = batch_pricer(pricer)
    inst = Instance("both", StepScheduler(BlockPool(2000, 16, prefix_caching=False), 64, 2048),
                    lambda b: p(b, float(b.num_tokens)))  # fmt: skip
    reqs = [request(i, 0.05 * i, list(range(i, i + 200)), 50) for i in range(20)]
    res = replay_cluster(reqs, [inst])
    assert len(res.requests) == 20 and all(r.done_s > r.first_token_s for r in res.requests)
    tr = res.instances[0]
    assert sum(k for _, k in tr.tokens) == 20 * 50
    one, many = pricer.cost([], [300]), pricer.cost([], [300] * 32)
    assert one.moe > 0 and many.moe > 3 * one.moe  # 2 experts touched vs nearly all 16
