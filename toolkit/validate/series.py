"""Per-tick series of a replayed cluster run, and errors between series (pdlab validate).

Ticks count seconds from the first arrival, as the imported references do:
- generation throughput: tick k >= 1 holds the output tokens generated in (k-1, k], tick 0
  nothing (LLMServingSim's `Throughput per 1.0 sec` and vLLM's per-second log alike); a
  prefill instance of a PD split generates nothing the client sees;
- states (KV in use, prefix hits) are read at each tick's time: the state after the last
  iteration that ended by then. KV in use is in MiB (the artifact's "MB": 2 MiB per
  16-token block of Llama-3.1-8B); prefix hit % is prompt tokens found in the cache since
  the start over prompt tokens queried (vLLM's counters), per instance for the GPU cache
  and over all instances for a shared CPU pool.
Errors: `tick_mape` (mean |twin - real| / real over ticks with real > 0, a fraction),
`tick_mae` (mean |twin - real|, the series' unit), `tick_wape` (sum |twin - real| over sum
real: a relative error that the first ticks' near-zero values do not blow up), `span_ticks`
(the end of the last tick with output). `block_interval` is a moving-block bootstrap over
ticks (neighbouring ticks are correlated) of any of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from cluster.sim.engine_model.cluster_replay import ClusterReplay
from toolkit.twin.metrics import interval

BLOCK_TICKS = 5


def throughput_ticks(replay: ClusterReplay, origin: float, n: int) -> np.ndarray:
    """Output tokens per tick of every instance that streams to clients (module doc)."""
    out = np.zeros(n)
    for tr in replay.instances:
        if tr.role == "prefill" or not tr.tokens:
            continue
        t = np.array([x[0] for x in tr.tokens]) - origin
        k = np.array([x[1] for x in tr.tokens], dtype=float)
        idx = np.maximum(np.ceil(t - 1e-12), 0).astype(int)
        keep = idx < n
        np.add.at(out, idx[keep], k[keep])
    return out


def _at_ticks(times: Sequence[float], values: np.ndarray, origin: float, n: int) -> np.ndarray:
    """values[-1 of those with time <= tick] at each tick (0 before the first)."""
    if len(times) == 0:
        return np.zeros(n)
    pos = np.searchsorted(np.asarray(times) - origin, np.arange(n), side="right") - 1
    return np.where(pos >= 0, values[np.maximum(pos, 0)], 0.0)


def state_ticks(replay: ClusterReplay, node: int, origin: float, n: int) -> dict[str, np.ndarray]:
    """Per tick of one instance: KV blocks in use, queries, local and external hits."""
    st = replay.instances[node].state
    t = [s[0] for s in st]
    cols = np.array([s[3:7] for s in st], dtype=float).reshape(-1, 4)
    return {
        name: _at_ticks(t, cols[:, i], origin, n)
        for i, name in enumerate(("kv_blocks", "queries", "local_hits", "external_hits"))
    }


def hit_pct(hits: np.ndarray, queries: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(queries > 0, 100.0 * hits / np.maximum(queries, 1), 0.0)


def pool_chunks_ticks(replay: ClusterReplay, origin: float, n: int) -> np.ndarray:
    pool = replay.pool
    if pool is None:
        return np.zeros(n)
    return _at_ticks(
        [x[0] for x in pool.trace], np.array([x[1] for x in pool.trace], float), origin, n
    )


def span_ticks(series: np.ndarray) -> int:
    """The end of the last tick with output (0 if none)."""
    nz = np.nonzero(np.asarray(series) > 0)[0]
    return int(nz[-1]) if nz.size else 0


def _pad(real: np.ndarray, twin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = max(len(real), len(twin))
    return np.pad(real, (0, n - len(real))), np.pad(twin, (0, n - len(twin)))


def tick_mape(real: np.ndarray, twin: np.ndarray) -> float:
    r, t = _pad(np.asarray(real, float), np.asarray(twin, float))
    k = r > 0
    return float(np.mean(np.abs(t[k] - r[k]) / r[k])) if k.any() else math.nan


def tick_mae(real: np.ndarray, twin: np.ndarray) -> float:
    r, t = _pad(np.asarray(real, float), np.asarray(twin, float))
    return float(np.mean(np.abs(t - r))) if r.size else math.nan


def tick_wape(real: np.ndarray, twin: np.ndarray) -> float:
    r, t = _pad(np.asarray(real, float), np.asarray(twin, float))
    s = float(np.sum(np.abs(r)))
    return float(np.sum(np.abs(t - r)) / s) if s > 0 else math.nan


def block_interval(
    fn: Callable[[np.ndarray, np.ndarray], float],
    real: np.ndarray,
    twin: np.ndarray,
    *,
    samples: int = 1000,
    seed: int = 0,
    block: int = BLOCK_TICKS,
) -> tuple[float, float]:
    """95% interval of fn(real, twin) over moving-block resamples of the ticks."""
    r, t = _pad(np.asarray(real, float), np.asarray(twin, float))
    n = r.size
    if n == 0:
        return math.nan, math.nan
    b = max(1, min(block, n))
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, n - b + 1, size=(samples, -(-n // b)))
    idx = (starts[:, :, None] + np.arange(b)).reshape(samples, -1)[:, :n]
    vals = np.array([fn(r[i], t[i]) for i in idx])
    return interval(vals)
