"""The cluster twin's values and how far the model's error moves them (pdlab validate).

`cluster_twin(inputs, ticks)` replays an imported cluster run (toolkit.twin.lss) and
returns, besides the replay, its values and their interval sources (toolkit.twin.interval,
the same as `pdlab twin`'s: the profile's held-out residuals shared by the instances it
prices, each instance's ranged parameters at their ends) from the runner that replays the
whole cluster under a variant:
- scalars: `span_s` (first arrival to the last token), `throughput_tok_s` (output tokens
  over that span), `ttft_mean_s`, `tpot_mean_s`, `e2e_mean_s`, `kv_mem_mean_mib` (KV in use
  over the instances' ticks that have a real value);
- series per 1 s tick (toolkit.validate.series): `throughput` (generation), per instance
  `hit[i]` (prefix hit %) and `kv[i]` (KV in use, MiB), the shared pool's `pool_hit` and
  `pool_kv` (MiB).
`phase` holds one more per-tick band per series: the real series' ticks are a 1 s logger's
at a phase to the first arrival nobody recorded, so the twin's series is recomputed with
its ticks shifted by 1/4, 1/2 and 3/4 s, and the band spans what that moves each tick.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from cluster.core import ConfigError
from cluster.sim.engine_model.cluster_replay import ClusterReplay
from toolkit.twin.interval import (
    PROFILE_REPLAYS,
    Band,
    IntervalSource,
    Transform,
    Value,
    band,
    interval_sources,
)
from toolkit.twin.lss import (
    ClusterInputs,
    block_mib,
    instance_parameters,
    instance_setups,
    replay_cluster_run,
)
from toolkit.twin.metrics import Timings, point_values, span_values
from toolkit.validate.series import (
    hit_pct,
    pool_chunks_ticks,
    state_ticks,
    throughput_ticks,
)

PHASES = (0.25, 0.5, 0.75)


class Ticks(NamedTuple):
    """How many ticks each series has, and which of an instance's ticks have a real value."""

    throughput: int
    nodes: dict[int, np.ndarray]  # instance -> bool per tick (a real KV value)
    pool: int


class ClusterTwin(NamedTuple):
    inputs: ClusterInputs
    replay: ClusterReplay
    origin: float
    values: dict[str, Value]
    sources: list[IntervalSource]
    phase: dict[str, Band]
    ticks: Ticks


def timings(replay: ClusterReplay) -> Timings:
    reqs = replay.requests
    return Timings(
        np.array([q.arrival_s for q in reqs]),
        np.array([q.output_tokens for q in reqs], dtype=float),
        np.array([q.first_token_s for q in reqs]),
        np.array([q.done_s for q in reqs]),
    )


def _series(
    inputs: ClusterInputs, replay: ClusterReplay, origin: float, ticks: Ticks
) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {"throughput": throughput_ticks(replay, origin, ticks.throughput)}
    for node, mask in ticks.nodes.items():
        st = state_ticks(replay, node, origin, len(mask))
        out[f"hit[{node}]"] = hit_pct(st["local_hits"], st["queries"])
        out[f"kv[{node}]"] = st["kv_blocks"] * block_mib(inputs, node)
    if ticks.pool:
        q = e = np.zeros(ticks.pool)
        for node in range(len(replay.instances)):
            st = state_ticks(replay, node, origin, ticks.pool)
            q, e = q + st["queries"], e + st["external_hits"]
        chunk_mib = replay.pool.chunk_bytes / 2**20 if replay.pool is not None else 0.0
        out["pool_hit"] = hit_pct(e, q)
        out["pool_kv"] = pool_chunks_ticks(replay, origin, ticks.pool) * chunk_mib
    return out


def values(
    inputs: ClusterInputs, replay: ClusterReplay, origin: float, ticks: Ticks
) -> dict[str, Value]:
    """The replay's scalars and series (module docstring)."""
    t = timings(replay)
    out: dict[str, Value] = {k: float(v) for k, v in span_values(t).items()}
    point = point_values(t)
    out |= {k: point[k] for k in ("ttft_mean_s", "tpot_mean_s", "e2e_mean_s")}
    series = _series(inputs, replay, origin, ticks)
    if ticks.nodes:
        kv = np.concatenate([series[f"kv[{n}]"][m] for n, m in ticks.nodes.items()])
        out["kv_mem_mean_mib"] = float(kv.mean()) if kv.size else float("nan")
    return out | series


def _phase_bands(
    inputs: ClusterInputs, replay: ClusterReplay, origin: float, ticks: Ticks
) -> dict[str, Band]:
    base = _series(inputs, replay, origin, ticks)
    shifted = [_series(inputs, replay, origin - p, ticks) for p in PHASES]
    out = {}
    for k, b in base.items():
        d = [s[k] - b for s in shifted]
        out[k] = (
            np.maximum.reduce([np.zeros(len(b)), *(-x for x in d)]),
            np.maximum.reduce([np.zeros(len(b)), *d]),
        )
    return out


def cluster_twin(
    inputs: ClusterInputs,
    ticks_for: Callable[[ClusterReplay, float], Ticks],
    *,
    profile_replays: int = PROFILE_REPLAYS,
    seed: int = 0,
) -> ClusterTwin:
    """Replay, values, interval sources and phase bands of a cluster run (module doc);
    `ticks_for(replay, origin)`: the ticks of the series, from the baseline replay."""
    setups = instance_setups(inputs)
    replay = replay_cluster_run(inputs, setups)
    origin = min(q.arrival_s for q in inputs.requests)
    ticks = ticks_for(replay, origin)
    base = values(inputs, replay, origin, ticks)

    def run(change: Transform) -> dict[str, Value] | None:
        try:
            got = replay_cluster_run(inputs, [change(i, s) for i, s in enumerate(setups)])
        except ConfigError:  # a variant's KV cannot hold a request
            return None
        return values(inputs, got, origin, ticks)

    peaks = [max((s[3] for s in tr.state), default=0) for tr in replay.instances]
    sources = interval_sources(
        base, instance_parameters(inputs), run, peak_blocks=peaks,
        profile_replays=profile_replays, seed=seed,
    )  # fmt: skip
    phase = _phase_bands(inputs, replay, origin, ticks)
    return ClusterTwin(inputs, replay, origin, base, sources, phase, ticks)


def spreads(twin: ClusterTwin, key: str) -> dict[str, tuple[float, float]]:
    """Each model source's (down, up) of a scalar value, log units."""
    return {s.name: s.spread[key] for s in twin.sources if key in s.spread}


def inside_band(
    twin: ClusterTwin, key: str, real: np.ndarray, keep: np.ndarray | None = None
) -> np.ndarray:
    """Per tick kept (`keep`, else every tick with a real value): 1 where the real value lies
    in the twin's per-tick 95% band of series `key` (every model source's per-tick spread
    and the tick phase, in quadrature), 0 where not, NaN where the band is unbounded."""
    real = np.asarray(real, dtype=float)
    n = len(real)
    base = np.asarray(twin.values[key], dtype=float)
    lo, hi = band(
        np.pad(base, (0, max(0, n - len(base))))[:n], twin.sources, key, [twin.phase[key]]
    )
    with np.errstate(invalid="ignore"):
        inside = ((real >= lo - 1e-9) & (real <= hi + 1e-9)).astype(float)
    inside[~(np.isfinite(lo) & np.isfinite(hi))] = np.nan
    k = ~np.isnan(real) if keep is None else np.asarray(keep, bool)[:n] & ~np.isnan(real)
    return inside[k]


def share(inside: np.ndarray) -> float | None:
    """The share of ticks inside the band; None when a band is not known (or no ticks)."""
    if not inside.size or np.isnan(inside).any():
        return None
    return float(inside.mean())
