"""Serving metrics of replayed and recorded requests, with paired bootstrap resamples.

The metrics of toolkit.queries.serving (TTFT, TPOT, E2E: mean, P50, P90, P99; throughput in
requests/s over first arrival to last completion), computed with numpy over per-request
times so that each can be recomputed on resampled requests. The bootstrap draws one set of
request indices per resample and applies it to every variant (real, replay, what-if), so
the variants stay paired: an interval of their ratio covers which requests the run had.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import NamedTuple

import numpy as np

from cluster.core import ConfigError

STATS: tuple[tuple[str, float | None], ...] = (
    ("mean", None),
    ("p50", 50.0),
    ("p90", 90.0),
    ("p99", 99.0),
)
BOOTSTRAP_SAMPLES = 1000


class Timings(NamedTuple):
    """Per-request times of one variant, same request order in every variant (seconds)."""

    t_arrival: np.ndarray
    t_out: np.ndarray
    t_first_token: np.ndarray
    t_done: np.ndarray


class TwinMetric(NamedTuple):
    real: float
    sim: float
    error: float  # sim / real - 1
    # 95% interval of `error`: the bootstrap's (`compare`), or with the model's error
    # combined (`combined_interval`, toolkit.twin.interval)
    ci95: tuple[float, float]
    ci95_requests: tuple[float, float] | None = None  # the bootstrap's, once combined
    sources: dict[str, tuple[float, float]] | None = None  # source -> (down, up), log units

    @property
    def known(self) -> bool:
        """Whether the interval is bounded (an error above -100%, below infinity)."""
        return bool(self.ci95[0] > -1.0 and np.isfinite(self.ci95[1]))

    @property
    def covered(self) -> bool:
        """Whether the interval holds the real value (an error of 0)."""
        return bool(self.ci95[0] <= 0.0 <= self.ci95[1])

    @property
    def half_width(self) -> float:
        return (self.ci95[1] - self.ci95[0]) / 2.0


def bootstrap_indices(n: int, samples: int, seed: int) -> np.ndarray:
    if n == 0:
        raise ConfigError("no finished requests to compare")
    return np.random.default_rng(seed).integers(0, n, size=(samples, n))


def nan_percentile(x: np.ndarray, q: float) -> np.ndarray:
    """`np.nanpercentile(x, q, axis=-1)` (linear interpolation), vectorized over the rows.

    numpy's own goes row by row in Python once any NaN is present (1,000 bootstrap rows x 13
    statistics took seconds); here one sort puts the NaN last in every row and each row's
    percentile is read at its own count of finite values. A row of only NaN gives NaN.
    """
    nan = np.isnan(x)
    if not nan.any():
        return np.percentile(x, q, axis=-1)
    s = np.sort(x, axis=-1)
    n = (~nan).sum(axis=-1)
    pos = np.maximum(n - 1, 0) * (q / 100.0)
    lo = np.floor(pos).astype(np.intp)
    hi = np.minimum(lo + 1, np.maximum(n - 1, 0))
    v_lo = np.take_along_axis(s, lo[..., None], axis=-1)[..., 0]
    v_hi = np.take_along_axis(s, hi[..., None], axis=-1)[..., 0]
    with np.errstate(invalid="ignore"):
        out = v_lo + (v_hi - v_lo) * (pos - lo)
    return np.where(n > 0, out, np.nan)


def _statistic(q: float | None) -> Callable[[np.ndarray], np.ndarray]:
    """Mean or percentile over the last axis, skipping NaN (TPOT of one-token requests)."""
    if q is None:
        return lambda x: np.nanmean(x, axis=-1)
    return lambda x: nan_percentile(x, q)


def metric_values(t: Timings, idx: np.ndarray) -> dict[str, tuple[float, np.ndarray]]:
    """metric name -> (value on all requests, values on each resample `idx` row)."""
    multi = t.t_out > 1
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(multi, (t.t_done - t.t_first_token) / np.maximum(t.t_out - 1, 1), np.nan)
    columns = {"ttft": t.t_first_token - t.t_arrival, "tpot": tpot, "e2e": t.t_done - t.t_arrival}
    out: dict[str, tuple[float, np.ndarray]] = {}
    for metric, col in columns.items():
        for name, q in STATS:
            f = _statistic(q)
            out[f"{metric}_{name}_s"] = (float(f(col)), f(col[idx]))

    def throughput(done: np.ndarray, arr: np.ndarray) -> np.ndarray:
        return done.shape[-1] / (done.max(axis=-1) - arr.min(axis=-1))

    out["throughput_rps"] = (
        float(throughput(t.t_done, t.t_arrival)),
        throughput(t.t_done[idx], t.t_arrival[idx]),
    )
    return out


def interval(values: np.ndarray) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles of the finite values."""
    v = values[np.isfinite(values)]
    if not v.size:
        return float("nan"), float("nan")
    lo, hi = np.percentile(v, [2.5, 97.5])
    return float(lo), float(hi)


def compare(
    real: Timings, sim: Timings, *, samples: int = BOOTSTRAP_SAMPLES, seed: int = 0
) -> dict[str, TwinMetric]:
    """Real vs simulated metrics of the same requests, with the error's 95% interval."""
    idx = bootstrap_indices(len(real.t_arrival), samples, seed)
    r, s = metric_values(real, idx), metric_values(sim, idx)
    out = {}
    for name, (rv, rb) in r.items():
        sv, sb = s[name]
        with np.errstate(divide="ignore", invalid="ignore"):
            errs = sb / rb - 1.0
        error = sv / rv - 1.0 if rv else float("nan")
        out[name] = TwinMetric(rv, sv, error, interval(errs))
    return out


def request_spread(m: TwinMetric) -> tuple[float, float]:
    """(down, up): how far log(1 + error) may go below and above its value over requests,
    from the bootstrap interval `m.ci95` (module docstring)."""
    return interval_spread(m.error, m.ci95)


def interval_spread(error: float, ci95: tuple[float, float]) -> tuple[float, float]:
    """(down, up) of log(1 + error) that an interval `ci95` of the error spans around it
    (a side the interval does not reach past the error adds nothing)."""
    u = np.log1p(error)
    lo, hi = ci95
    down = u - np.log1p(lo) if lo > -1.0 else np.inf
    up = np.log1p(hi) - u if np.isfinite(hi) else np.inf
    return float(max(down, 0.0)), float(max(up, 0.0))


def span_values(t: Timings, idx: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """`span_s` (first arrival to last token) and `throughput_tok_s` (output tokens over
    that span) of `t`, on every resample row of `idx` (all requests when None)."""
    out, arr, done = (
        (t.t_out, t.t_arrival, t.t_done)
        if idx is None
        else (t.t_out[idx], t.t_arrival[idx], t.t_done[idx])
    )
    span = np.asarray(done.max(axis=-1) - arr.min(axis=-1))
    return {"span_s": span, "throughput_tok_s": np.asarray(out.sum(axis=-1) / span)}


def run_values(t: Timings) -> dict[str, float]:
    """Every metric of `t` (point_values) and its span and output token rate."""
    return point_values(t) | {k: float(v) for k, v in span_values(t).items()}


def combined_interval(
    error: float, spreads: Mapping[str, tuple[float, float]]
) -> tuple[float, float]:
    """The 95% interval of a twin metric's error sim / real - 1 given each source's spread.

    `spreads`: source -> (down, up) >= 0, how far log(sim / real) may lie below and above
    its value on account of that source (each a 95% range: request resampling, the
    profile's held-out error, an assumed parameter at its low and high end; see
    toolkit.twin.interval). Independent sources add in quadrature on each side:
    [exp(u - sqrt(sum down^2)) - 1, exp(u + sqrt(sum up^2)) - 1] with u = log(1 + error).
    The interval holds 0 exactly when the real value lies within the twin's prediction
    interval [sim * exp(-sqrt(sum down^2)), sim * exp(sqrt(sum up^2))]. An infinite spread
    (a parameter whose end the replay cannot run) gives an unbounded side.
    """
    if not np.isfinite(error) or error <= -1.0:
        return float("nan"), float("nan")
    u = float(np.log1p(error))
    down = float(np.sqrt(sum(d * d for d, _ in spreads.values())))
    up = float(np.sqrt(sum(x * x for _, x in spreads.values())))
    return float(np.expm1(u - down)), float(np.expm1(u + up))


def point_values(t: Timings) -> dict[str, float]:
    """Every metric of `t` on all its requests (no resampling)."""
    idx = np.arange(len(t.t_arrival))[None, :]
    return {k: v for k, (v, _) in metric_values(t, idx).items()}


def twin_run_id(db: str | os.PathLike[str], run_id: str) -> str:
    """The id a new twin of `run_id` is stored under: `twin-<run>`, else `twin-<run>-<n>`."""
    from telemetry import open_reader

    taken = set(open_reader(db).runs()["run_id"].to_list())
    base = rid = f"twin-{run_id}"
    n = 1
    while rid in taken:
        n += 1
        rid = f"{base}-{n}"
    return rid
