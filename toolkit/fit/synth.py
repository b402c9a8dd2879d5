"""Synthetic iteration logs from known coefficients (paper 000 §5.1, Eq. 1–2; App. B.3).

`synth_logs` writes a run whose prefill and decode iteration times follow the paper's
iteration-time models exactly, times multiplicative lognormal noise, over batches shaped
like a chunked-prefill engine's: an 8,192-token budget per prefill iteration filled FIFO
from a queue of requests (agent turns with cached prefixes up to 128K tokens, fresh long
prompts split into chunks whose t_c counts the earlier chunks, short requests packed
several to a batch), host restores (t_rst, part of the cached prefix, charged to the
first chunk only), and decode batches of B = 1..128 requests feeding t_fwd = 1..4 tokens
each on a k = 8 of E = 256 MoE. Coefficient recovery is then a real test of the fitter:
the truth is known and the batches are as uneven as an engine's.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from models.iteration import phi
from telemetry import TelemetryWriter

CHUNK_TOKENS = 8192
MAX_CACHED_TOKENS = 131_072
MAX_BATCH = 128

# Plausible for a large MoE on one 8-GPU node: ~0.5 s per full 8K chunk, 4 ms launch cost,
# attention 0.3 s for an 8K chunk over a 128K prefix, 2 µs per token restored from host;
# decode 12 ms + up to 8 ms of expert weight reads + 0.15 ms per request.
DEFAULT_TRUTH: dict[str, Any] = {
    "prefill": (4.0e-3, 6.0e-5, 3.0e-10, 2.0e-6),
    "decode": (1.2e-2, 8.0e-3, 1.5e-4),
    "moe_top_k": 8,
    "moe_experts": 256,
}


def _truth_for(
    truth: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None, nodes: int
) -> list[dict[str, Any]]:
    """One truth dict per node; a single mapping applies to every node."""
    if truth is None:
        per = [dict(DEFAULT_TRUTH)] * nodes
    elif isinstance(truth, Mapping):
        per = [{**DEFAULT_TRUTH, **truth}] * nodes
    else:
        if len(truth) != nodes:
            raise ValueError(
                f"truth has {len(truth)} entries for {nodes} nodes; give one per node or one mapping"
            )
        per = [{**DEFAULT_TRUTH, **t} for t in truth]
    for i, t in enumerate(per):
        if len(t["prefill"]) != 4 or len(t["decode"]) != 3:
            raise ValueError(
                f"node {i}: truth needs prefill (c0, c1, c2, c3) and decode (d0, d1, d2)"
            )
        if any(c < 0 for c in (*t["prefill"], *t["decode"])):
            raise ValueError(
                f"node {i}: coefficients must be >= 0, got {t['prefill']} / {t['decode']}"
            )
        k, e = int(t["moe_top_k"]), int(t["moe_experts"])
        if e < 0 or (e > 0 and not 0 < k <= e):
            raise ValueError(
                f"node {i}: need 1 <= moe_top_k <= moe_experts or moe_experts = 0, got k={k}, E={e}"
            )
    return per


def _log_uniform(rng: np.random.Generator, lo: float, hi: float) -> int:
    return round(float(np.exp(rng.uniform(np.log(lo), np.log(hi)))))


def _draw_request(rng: np.random.Generator) -> tuple[int, int, int]:
    """(t_uc, t_c, t_rst) of one arriving request."""
    kind = rng.random()
    if kind < 0.45:  # agent turn: long cached context, a new observation appended
        t_c = _log_uniform(rng, 1024, MAX_CACHED_TOKENS)
        t_uc = _log_uniform(rng, 32, 6144)
    elif kind < 0.65:  # fresh long prompt: several 8K chunks
        t_c = 0 if rng.random() < 0.5 else _log_uniform(rng, 256, 4096)
        t_uc = _log_uniform(rng, 4096, 40_000)
    else:  # short request
        t_c = 0 if rng.random() < 0.5 else _log_uniform(rng, 64, 8192)
        t_uc = _log_uniform(rng, 16, 1536)
    t_rst = 0
    if t_c > 0 and rng.random() < 0.35:  # part of the cached prefix lives in host memory
        t_rst = round(t_c * rng.uniform(0.1, 1.0))
    return t_uc, t_c, t_rst


def _prefill_node(
    rng: np.random.Generator, node_id: int, iters: int
) -> tuple[dict[str, np.ndarray], dict[str, list[Any]]]:
    """Run a FIFO chunked-prefill scheduler for `iters` iterations; per-chunk rows out."""
    queue: deque[list[Any]] = deque()  # [request_id, uc_left, t_c_done, t_rst_pending]
    next_req = 0
    it_rows: dict[str, list[float]] = {
        k: [] for k in ("num_reqs", "t_uc", "attn_pairs", "t_rst", "t_c")
    }
    req_rows: dict[str, list[Any]] = {
        k: [] for k in ("iter_id", "request_id", "t_uc", "t_c", "t_rst")
    }
    # Bursty arrivals: some iterations run on a backlog (full 8K budget), others on one or
    # two small requests, so c0 is identifiable from the small ones.
    rates = rng.choice([0.3, 1.0, 2.5], size=iters, p=[0.35, 0.4, 0.25])
    for it in range(iters):
        for _ in range(int(rng.poisson(rates[it]))):
            uc, c, rst = _draw_request(rng)
            queue.append([f"n{node_id}-r{next_req}", uc, c, rst])
            next_req += 1
        if not queue:
            uc, c, rst = _draw_request(rng)
            queue.append([f"n{node_id}-r{next_req}", uc, c, rst])
            next_req += 1
        budget = CHUNK_TOKENS
        n_reqs = sum_uc = sum_c = sum_rst = 0
        sum_a = 0.0
        while budget > 0 and queue and n_reqs < MAX_BATCH:
            req = queue[0]
            take = min(req[1], budget)
            t_c, t_rst = req[2], req[3]
            req_rows["iter_id"].append(it)
            req_rows["request_id"].append(req[0])
            req_rows["t_uc"].append(take)
            req_rows["t_c"].append(t_c)
            req_rows["t_rst"].append(t_rst)
            n_reqs += 1
            sum_uc += take
            sum_c += t_c
            sum_rst += t_rst
            sum_a += take * t_c + take * (take + 1) / 2.0
            budget -= take
            req[1] -= take
            req[2] += take  # later chunks attend to this one (t_c counts earlier chunks)
            req[3] = 0  # restore happens once, with the first chunk
            if req[1] == 0:
                queue.popleft()
        for key, val in zip(it_rows, (n_reqs, sum_uc, sum_a, sum_rst, sum_c), strict=True):
            it_rows[key].append(val)
    return {k: np.asarray(v) for k, v in it_rows.items()}, req_rows


def synth_logs(
    db_path: str | Path,
    run_id: str | None = None,
    *,
    nodes: int = 4,
    prefill_iters: int = 5000,
    decode_iters: int = 5000,
    truth: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
    noise: float = 0.03,
    seed: int = 0,
) -> str:
    """Write a synthetic run (runs, nodes, prefill/decode iterations) and return its run_id.

    `truth` holds "prefill" (c0..c3), "decode" (d0..d2) in seconds and "moe_top_k",
    "moe_experts" (0 = dense); one mapping for all nodes or one per node. `noise` is the
    sigma of the multiplicative lognormal noise on every iteration time.
    """
    if nodes < 1:
        raise ValueError(f"nodes must be >= 1, got {nodes}")
    if prefill_iters < 0 or decode_iters < 0:
        raise ValueError(f"iteration counts must be >= 0, got {prefill_iters}, {decode_iters}")
    if not 0 <= noise < 1:
        raise ValueError(f"noise is a relative sigma in [0, 1), got {noise}")
    per_node = _truth_for(truth, nodes)
    rng = np.random.default_rng(seed)
    run_id = run_id or f"synth-{uuid.uuid4().hex[:12]}"

    pre_parts, req_parts, dec_parts = [], [], []
    for n, t in enumerate(per_node):
        c0, c1, c2, c3 = t["prefill"]
        it, reqs = _prefill_node(rng, n, prefill_iters)
        clean = c0 + c1 * it["t_uc"] + c2 * it["attn_pairs"] + c3 * it["t_rst"]
        dur = clean * np.exp(rng.normal(0.0, noise, prefill_iters))
        pre_parts.append(
            {
                "node_id": np.full(prefill_iters, n, np.int32),
                "iter_id": np.arange(prefill_iters, dtype=np.int64),
                "t_start": np.cumsum(dur) - dur,  # back to back from t = 0
                "duration_s": dur,
                "num_reqs": it["num_reqs"].astype(np.int32),
                "t_uc": it["t_uc"].astype(np.int64),
                "attn_pairs": it["attn_pairs"].astype(np.float64),
                "t_rst": it["t_rst"].astype(np.int64),
                "t_c": it["t_c"].astype(np.int64),
            }
        )
        req_parts.append({"node_id": np.full(len(reqs["iter_id"]), n, np.int32), **reqs})

        d0, d1, d2 = t["decode"]
        b = rng.integers(1, MAX_BATCH + 1, decode_iters)
        t_fwd = rng.integers(1, 5, decode_iters).astype(np.float64)
        clean_d = (
            d0
            + d1 * phi(b.astype(np.float64), int(t["moe_top_k"]), int(t["moe_experts"]), t_fwd)
            + d2 * b
        )
        dur_d = clean_d * np.exp(rng.normal(0.0, noise, decode_iters))
        dec_parts.append(
            {
                "node_id": np.full(decode_iters, n, np.int32),
                "iter_id": np.arange(decode_iters, dtype=np.int64),
                "t_start": float(dur.sum()) + np.cumsum(dur_d) - dur_d,  # after the prefills
                "duration_s": dur_d,
                "batch_size": b.astype(np.int32),
                "t_fwd": t_fwd,
                "ctx_tokens": (b * rng.integers(1024, MAX_CACHED_TOKENS, decode_iters)).astype(
                    np.int64
                ),
            }
        )

    config = {"generator": "toolkit.fit.synth", "seed": seed, "noise": noise, "truth": per_node}
    node_rows = {
        "node_id": np.arange(nodes, dtype=np.int32),
        "name": [f"synth-{n}" for n in range(nodes)],
        "hardware": ["synthetic"] * nodes,
        "moe_top_k": np.array([t["moe_top_k"] for t in per_node], np.int32),
        "moe_experts": np.array([t["moe_experts"] for t in per_node], np.int32),
    }
    with TelemetryWriter(db_path, run_id, source="synth", config=config) as writer:
        writer.add_nodes(node_rows)
        writer.append("prefill_iterations", _concat(pre_parts))
        writer.append("prefill_iteration_requests", _concat(req_parts))
        writer.append("decode_iterations", _concat(dec_parts))
        return writer.run_id


def _concat(parts: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in parts[0]:
        vals = [p[key] for p in parts]
        out[key] = (
            np.concatenate(vals)
            if isinstance(vals[0], np.ndarray)
            else list(chain.from_iterable(vals))
        )
    return out
