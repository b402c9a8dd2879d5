"""Control-plane benchmarks for `pdlab bench` (SPEC §8).

- `kv_events_per_s`: KV events (one BlockStored / BlockRemoved per block) the directory
  ingests per second, in batches of 16 blocks as engines publish them.
- `directory_bytes_per_block`: memory the directory holds per block (tracemalloc).
- `router_decision_p50_ms` / `_p99_ms`: the predicted-TTFT router choosing among 32 prefill
  nodes for requests with 64K-token contexts (1,024 blocks of 64 tokens), directory of
  >= 1M blocks, every node with a fresh report and a queue.
"""

from __future__ import annotations

import gc
import time
import tracemalloc
from typing import Any

import numpy as np

from cluster.control.routing import PredictedTTFTRouter
from cluster.control.state import ClusterState, ClusterView, NodeReport, QueuedWork, RouteRequest
from cluster.core import KVEvent, KVEventKind
from cluster.kv.directory import KVDirectory
from cluster.kv.hashing import chain_path
from models import DecodeModel, NodeModel, PrefillModel

BLOCK = 64
CTX_BLOCKS = 1024  # 64K tokens


def _paths(num: int, rng: np.random.Generator) -> list[list[int]]:
    """Contexts that share prefixes like agents do: a few system prompts, then unique."""
    prompts = [chain_path(p, 32) for p in range(8)]
    out = []
    for k in range(num):
        base = prompts[k % 8]
        out.append(base + chain_path(k, CTX_BLOCKS - len(base), base[-1]))
    return out


def run(quick: bool) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    num_ctx = 300 if quick else 1100  # ~1.1M distinct blocks when not quick
    nodes = list(range(32))
    paths = _paths(num_ctx, rng)
    events = []
    for k, path in enumerate(paths):
        node = nodes[k % 32]
        for s in range(0, len(path), 16):
            parent = path[s - 1] if s else None
            events.append(
                KVEvent(
                    0.0, node, KVEventKind.STORED, "host", tuple(path[s : s + 16]), parent, BLOCK
                )
            )
    # A long-running router tunes the cyclic GC the way pdlab's servers and simulator do:
    # directory entries hold no cycles, so scanning them every few hundred allocations
    # only costs time.
    gc.collect()
    gc.freeze()
    old_threshold = gc.get_threshold()
    gc.set_threshold(100_000, 50, 100)
    tracemalloc.start()
    d = KVDirectory(BLOCK)
    t0 = time.perf_counter()
    for e in events:
        d.apply(e)
    ingest_s = time.perf_counter() - t0
    mem, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    blocks = int(d.stats()["blocks"])
    # A second copy on a peer for a third of the contexts (fetchable prefixes).
    for k, path in enumerate(paths[::3]):
        d.store((k * 7 + 3) % 32, path[: len(path) // 2], 0, "host", 1.0, BLOCK)
    state = ClusterState(
        phases={n: "prefill" for n in nodes},
        models={
            n: NodeModel(PrefillModel(0.03, 8e-5, 4e-10, 3e-7), DecodeModel(0.012, 0.015, 2.8e-4))
            for n in nodes
        },
        directory=d,
    )
    for n in nodes:
        q = tuple(
            QueuedWork(f"q{n}-{i}", float(rng.integers(500, 8000)), float(rng.integers(0, 60000)))
            for i in range(int(rng.integers(0, 8)))
        )
        state.report(NodeReport(n, 10.0, "prefill", q, float(rng.uniform(0, 0.5)), len(q)))
    view = ClusterView(state)
    router = PredictedTTFTRouter()
    times = []
    cpu_times = []
    decisions = 500 if quick else 3000
    for i in range(decisions):
        path = paths[int(rng.integers(0, num_ctx))]
        cut = int(rng.integers(CTX_BLOCKS // 2, CTX_BLOCKS))
        # A new turn: the cached context plus appended blocks nobody holds yet.
        extra = chain_path(("new", i), CTX_BLOCKS - cut, path[cut - 1])
        req = RouteRequest(f"r{i}", "p", "b", path[:cut] + extra, CTX_BLOCKS * BLOCK, 10.5)
        c = time.thread_time()
        t = time.perf_counter()
        router.route(req, view)
        times.append(time.perf_counter() - t)
        cpu_times.append(time.thread_time() - c)
    gc.set_threshold(*old_threshold)
    gc.unfreeze()
    ms = np.array(times) * 1e3
    cpu_ms = np.array(cpu_times) * 1e3
    return {
        "kv_events_per_s": round(sum(len(e.block_hashes) for e in events) / ingest_s),
        "kv_event_batches_per_s": round(len(events) / ingest_s),
        "directory_blocks": blocks,
        "directory_bytes_per_block": round(mem / blocks, 1),
        "router_decision_p50_ms": round(float(np.percentile(ms, 50)), 4),
        "router_decision_p99_ms": round(float(np.percentile(ms, 99)), 4),
        # CPU time of the deciding thread: unaffected by other processes on a shared machine.
        "router_decision_cpu_p50_ms": round(float(np.percentile(cpu_ms, 50)), 4),
        "router_decision_cpu_p99_ms": round(float(np.percentile(cpu_ms, 99)), 4),
        "router_prefill_nodes": len(nodes),
        "router_context_tokens": CTX_BLOCKS * BLOCK,
    }
