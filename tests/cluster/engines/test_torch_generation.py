"""Generation on the torch engine equals one full forward pass (SPEC §9 must-shows).

Chunked prefill, prefix-cache hits (device and restored from the host tier) and batched
decoding must produce the logits the unpaged model gives for the whole sequence at once.
"""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest
import torch

from cluster.engines.torch.request import EngineRequest
from cluster.kv.hashing import token_block_hashes

TOL = {"rtol": 1e-4, "atol": 1e-4}


class Waiter:
    """Collects one request's updates; `wait()` returns its finish reason."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.updates: list[list[int]] = []
        self.finish: dict[str, Any] | None = None

    def __call__(self, ids: list[int], fin: dict[str, Any] | None) -> None:
        self.updates.append(ids)
        if fin is not None:
            self.finish = fin
            self.done.set()

    def wait(self, timeout_s: float = 60.0) -> dict[str, Any]:
        assert self.done.wait(timeout_s), "request did not finish"
        assert self.finish is not None
        return self.finish


def _request(ids: list[int], n: int, rid: str = "r") -> tuple[EngineRequest, Waiter]:
    w = Waiter()
    req = EngineRequest(rid, ids, n, w, ignore_eos=True, record_logits=True)
    return req, w


def _prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(n)]


def _check_against_dense(sched, req: EngineRequest) -> None:  # type: ignore[no-untyped-def]
    """Logits of each sampled token equal the dense forward over prompt + outputs."""
    full = sched.runner.model.dense_logits(req.input_ids + req.output_ids[:-1])
    want = full[len(req.input_ids) - 1 :]
    got = torch.stack(req.logits)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, **TOL)
    assert req.output_ids == want.argmax(-1).tolist()


def test_chunked_prefill_equals_one_full_forward(engine_parts) -> None:  # type: ignore[no-untyped-def]
    sched = engine_parts(chunk_tokens=16, page_size=8)
    req, w = _request(_prompt(75, 0), 6)
    sched.submit(req)
    assert w.wait() == {"type": "length", "length": 6}
    assert sched.num_passes == 5 + 5  # ceil(75 / 16) prefill chunks, 5 decode passes
    _check_against_dense(sched, req)
    sched.call(sched.cache.check_invariants).result()


def test_prefix_cache_hit_computes_only_the_new_tokens(engine_parts) -> None:  # type: ignore[no-untyped-def]
    sched = engine_parts(page_size=16)
    first, w1 = _request(_prompt(100, 1), 5, "a")
    sched.submit(first)
    w1.wait()
    passes = sched.num_passes
    # The next turn: the first's context and output, plus new tokens.
    ids = first.input_ids + first.output_ids + _prompt(30, 2)
    second, w2 = _request(ids, 4, "b")
    sched.submit(second)
    w2.wait()
    # 104 tokens of the first request have K/V: 6 full pages are reused.
    assert second.cached_tokens == 96 and second.restored_tokens == 0
    assert sched.num_passes == passes + 1 + 3  # one prefill pass of 39 tokens
    _check_against_dense(sched, second)
    sched.call(sched.cache.check_invariants).result()


def test_batched_requests_each_equal_their_own_forward(engine_parts) -> None:  # type: ignore[no-untyped-def]
    sched = engine_parts(chunk_tokens=64, page_size=8)
    reqs = [_request(_prompt(n, 10 + n), 3 + n % 5, f"r{n}") for n in (5, 17, 40, 63, 90)]
    for req, _ in reqs:
        sched.submit(req)
    for _, w in reqs:
        w.wait()
    for req, _ in reqs:
        _check_against_dense(sched, req)
    # Continuous batching: fewer passes than the requests' passes one by one.
    alone = sum(-(-len(r.input_ids) // 64) + r.max_new_tokens - 1 for r, _ in reqs)
    assert sched.num_passes < alone
    sched.call(sched.cache.check_invariants).result()


def test_host_tier_restores_evicted_prefixes_exactly(engine_parts) -> None:  # type: ignore[no-untyped-def]
    """A device pool of 12 pages: a second long context evicts the first from the device;
    the first's next turn restores it from the host tier (t_rst) instead of recomputing."""
    sched = engine_parts(page_size=16, gpu_pages=12, host_pages=64, chunk_tokens=256)
    a, wa = _request(_prompt(130, 3), 2, "a")
    sched.submit(a)
    wa.wait()
    b, wb = _request(_prompt(150, 4), 2, "b")
    sched.submit(b)
    wb.wait()
    assert sched.cache.num_evicted["GPU"] > 0
    again, w = _request(a.input_ids + _prompt(20, 5), 3, "a2")
    sched.submit(again)
    w.wait()
    assert again.cached_tokens == 128 and again.restored_tokens > 0
    _check_against_dense(sched, again)
    sched.call(sched.cache.check_invariants).result()


def test_branch_aware_eviction_keeps_counted_blocks(engine_parts) -> None:  # type: ignore[no-untyped-def]
    """With the control plane's counts, the referenced context survives a newer one."""
    sched = engine_parts(page_size=16, gpu_pages=12, host_pages=0, eviction="branch")
    keep, wk = _request(_prompt(64, 6), 1, "keep")
    sched.submit(keep)
    wk.wait()
    counts = {h: 1 for h in token_block_hashes(keep.input_ids, 16)}
    sched.call(lambda: sched.cache.set_policy("branch", counts)).result()
    for i in range(3):  # newer, unreferenced contexts that need the pool
        r, w = _request(_prompt(96, 20 + i), 1, f"n{i}")
        sched.submit(r)
        w.wait()
    gpu, _ = sched.cache.match(token_block_hashes(keep.input_ids, 16), 0.0)
    assert len(gpu) == 4
    sched.call(lambda: sched.cache.set_policy("lru")).result()
    r, w = _request(_prompt(96, 40), 1, "lru")
    sched.submit(r)
    w.wait()
    gpu, _ = sched.cache.match(token_block_hashes(keep.input_ids, 16), 0.0)
    assert len(gpu) < 4  # LRU gives the old context up


def test_random_workloads_keep_the_cache_invariants(engine_parts) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(7)
    sched = engine_parts(page_size=4, gpu_pages=40, host_pages=24, chunk_tokens=32)
    contexts = [_prompt(rng.randrange(3, 40), i) for i in range(4)]
    for round_ in range(4):
        waiters = []
        for i in range(5):
            base = contexts[rng.randrange(len(contexts))]
            ids = base[: rng.randrange(1, len(base) + 1)] + _prompt(
                rng.randrange(1, 12), 100 * round_ + i
            )
            req, w = _request(ids, rng.randrange(1, 6), f"{round_}-{i}")
            sched.submit(req)
            waiters.append((req, w))
        for req, w in waiters:
            fin = w.wait()
            if fin["type"] == "abort":  # too long for the pool: refused, nothing held
                assert "KV pages" in fin["message"]
                continue
            contexts.append(req.input_ids + req.output_ids)
        sched.call(sched.cache.check_invariants).result()
    assert sched.cache.private == 0 and sched.cache.reserved == 0


def test_a_request_larger_than_the_pool_is_refused(engine_parts) -> None:  # type: ignore[no-untyped-def]
    sched = engine_parts(page_size=16, gpu_pages=4, host_pages=0)
    req, w = _request(_prompt(100, 9), 4)
    sched.submit(req)
    fin = w.wait()
    assert fin["type"] == "abort" and fin["status_code"] == 400
    assert "needs 7 KV pages" in fin["message"]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_eos_ends_a_generation_unless_ignored(engine_parts, temperature: float) -> None:  # type: ignore[no-untyped-def]
    sched = engine_parts()
    eos = sched.cfg.model.eos_token_id
    probe, w = _request(_prompt(20, 11), 1)
    sched.submit(probe)
    w.wait()
    # Make EOS the greedy choice by biasing the LM head toward it.
    with torch.no_grad():
        sched.runner.model.lm_head.weight[eos] += (
            100.0 * sched.runner.model.lm_head.weight[0].sign()
        )
    stop = Waiter()
    sched.submit(EngineRequest("s", _prompt(20, 12), 8, stop, temperature=temperature))
    fin = stop.wait()
    if temperature == 0.0:
        assert fin == {"type": "stop", "matched": eos}
    go = Waiter()
    sched.submit(EngineRequest("g", _prompt(20, 12), 8, go, ignore_eos=True))
    assert go.wait() == {"type": "length", "length": 8}


def test_a_failed_pass_aborts_its_requests_and_the_engine_goes_on(engine_parts) -> None:  # type: ignore[no-untyped-def]
    sched = engine_parts()
    bad, w = _request([1, 2, 100_000], 2, "bad")  # outside the vocabulary: the embedding raises
    sched.submit(bad)
    fin = w.wait()
    assert fin["type"] == "abort" and fin["status_code"] == 500
    assert "engine pass failed" in fin["message"]
    ok, w2 = _request(_prompt(10, 1), 2, "ok")
    sched.submit(ok)
    assert w2.wait() == {"type": "length", "length": 2}
    sched.call(sched.cache.check_invariants).result()


def test_decode_role_continues_from_a_prefill_room_and_refuses_a_foreign_one(engine_parts) -> None:  # type: ignore[no-untyped-def]
    from cluster.engines.torch.request import TransferredKV

    prefill, decode = engine_parts("prefill"), engine_parts("decode")
    ids = _prompt(40, 13)
    req, w = _request(ids, 5, "p")
    req.bootstrap_room = 7
    prefill.submit(req)
    assert w.wait() == {"type": "length", "length": 1}
    room = prefill.rooms.take(7, 5.0)
    assert room is not None and room.first_token_id == req.output_ids[0]
    got, wd = _request(ids, 5, "d")
    got.transfer = TransferredKV(room.kv, room.first_token_id, room.cached_tokens)
    decode.submit(got)
    assert wd.wait() == {"type": "length", "length": 5}
    # The decode engine sampled tokens 2..5 over the KV it received; all five are what the
    # dense forward of the whole sequence gives.
    full = decode.runner.model.dense_logits(got.input_ids + got.output_ids[:-1])
    torch.testing.assert_close(torch.stack(got.logits), full[len(ids) :], **TOL)
    assert got.output_ids == full[len(ids) - 1 :].argmax(-1).tolist()
    foreign, wf = _request(ids, 5, "f")
    foreign.transfer = TransferredKV(room.kv[:1], room.first_token_id, 0)
    decode.submit(foreign)
    fin = wf.wait()
    assert fin["type"] == "abort" and "the KV transfer has shape" in fin["message"]
    decode.call(decode.cache.check_invariants).result()
