"""Does the iteration-time model fit real GPUs? Eq. 1-2 (paper 000 §5.1) on measured profiles.

The per-iteration times of toolkit.profiles.real are fitted by relative-error NNLS (the
scikit-learn estimators of models.fitting) and scored by k-fold cross-validation: every
point is predicted once by a fit that did not see it. Errors are reported overall, by
iteration size and by kind (single request, batch), and for decode by context and batch
size. Points are never dropped: where the form falls short (small, latency-bound chunks;
decode over mixed contexts) the tables show it. A second prefill fit that sees only
iterations of >= 512 tokens (what an engine running 512-token chunks logs) is reported
separately, labelled as such.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import polars as pl
from sklearn.model_selection import KFold, cross_val_predict

from models.estimators import DecodeRegressor, PrefillRegressor
from toolkit.profiles.real import compose_decode, compose_prefill, load_profile

SERVING_MIN_TOKENS = 512  # chunked-prefill engines run chunks of >= 512 tokens
TOKEN_BUCKETS = (
    (1, 128),
    (128, 256),
    (256, 512),
    (512, 1024),
    (1024, 2048),
    (2048, 4096),
    (4096, 8192),
    (8192, 1 << 20),
)
KV_BUCKETS = ((0, 512), (512, 1024), (1024, 2048), (2048, 4096), (4096, 16384), (16384, 1 << 20))
BATCH_BUCKETS = ((1, 8), (9, 32), (33, 128), (129, 256))


class BucketError(NamedTuple):
    """Held-out error of the points whose size falls in [lo, hi)."""

    lo: int
    hi: int
    points: int
    mape: float
    max_ape: float


class PrefillValidation(NamedTuple):
    coef: tuple[float, ...]  # fitted on every point (seconds)
    points: int
    mape: float  # k-fold held-out MAPE over all points
    mape_single: float
    mape_batch: float
    serving_mape: float  # iterations of >= SERVING_MIN_TOKENS tokens
    serving_mape_single: float
    serving_mape_batch: float
    by_tokens: tuple[BucketError, ...]
    # kind -> (MAPE, serving MAPE) of a fit on that kind only
    separate: dict[str, tuple[float, float]]
    # A second, separately labelled fit that sees only >= SERVING_MIN_TOKENS iterations (what an
    # engine running >= 512-token chunks logs); the all-points figures above stay primary.
    serving_only_coef: tuple[float, ...]
    serving_only_mape: float


class DecodeValidation(NamedTuple):
    coef: tuple[float, ...]
    points: int
    mape: float  # one fit over every (B, kv): Eq. 2 has no context term
    by_kv: tuple[BucketError, ...]
    by_batch: tuple[BucketError, ...]
    fixed_context_mape: float  # mean over kv levels of the held-out MAPE of per-level fits
    fixed_context_worst: float


def _heldout_ape(model: object, x: np.ndarray, y: np.ndarray, folds: int, seed: int) -> np.ndarray:
    pred = cross_val_predict(model, x, y, cv=KFold(folds, shuffle=True, random_state=seed))
    return np.abs(pred - y) / y


def _buckets(
    size: np.ndarray, ape: np.ndarray, edges: Sequence[tuple[int, int]]
) -> tuple[BucketError, ...]:
    out = []
    for lo, hi in edges:
        sel = (
            (size >= lo) & (size < hi)
            if edges is not BATCH_BUCKETS
            else (size >= lo) & (size <= hi)
        )
        if sel.any():
            out.append(
                BucketError(lo, hi, int(sel.sum()), float(ape[sel].mean()), float(ape[sel].max()))
            )
    return tuple(out)


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if values.size else float("nan")


def validate_prefill(points: pl.DataFrame, folds: int = 5, seed: int = 0) -> PrefillValidation:
    x = points.select("t_uc", "attn_pairs", "t_rst").to_numpy().astype(np.float64)
    y = points["duration_s"].to_numpy()
    kind = points["kind"].to_numpy()
    ape = _heldout_ape(PrefillRegressor(), x, y, folds, seed)
    serving = x[:, 0] >= SERVING_MIN_TOKENS
    separate = {}
    for k in ("single", "batch"):
        sel = kind == k
        ape_k = _heldout_ape(PrefillRegressor(), x[sel], y[sel], folds, seed)
        separate[k] = (_mean(ape_k), _mean(ape_k[serving[sel]]))
    coef = tuple(float(c) for c in PrefillRegressor().fit(x, y).coef_)
    serving_coef = tuple(float(c) for c in PrefillRegressor().fit(x[serving], y[serving]).coef_)
    serving_only = _heldout_ape(PrefillRegressor(), x[serving], y[serving], folds, seed)
    return PrefillValidation(
        coef,
        len(y),
        _mean(ape),
        _mean(ape[kind == "single"]),
        _mean(ape[kind == "batch"]),
        _mean(ape[serving]),
        _mean(ape[serving & (kind == "single")]),
        _mean(ape[serving & (kind == "batch")]),
        _buckets(x[:, 0], ape, TOKEN_BUCKETS),
        separate,
        serving_coef,
        _mean(serving_only),
    )


def validate_decode(points: pl.DataFrame, folds: int = 5, seed: int = 0) -> DecodeValidation:
    """Dense models (phi = 0): Eq. 2 reduces to d0 + d2*B; d1 is fixed at 0."""
    x = points.select("batch_size", "t_fwd").to_numpy().astype(np.float64)
    y = points["duration_s"].to_numpy()
    kv = points["kv"].to_numpy()
    dense = DecodeRegressor(top_k=0, num_experts=0)
    ape = _heldout_ape(dense, x, y, folds, seed)
    per_level = []
    for level in np.unique(kv):
        sel = kv == level
        if sel.sum() >= 2 * folds:
            per_level.append(_mean(_heldout_ape(dense, x[sel], y[sel], folds, seed)))
    coef = tuple(float(c) for c in DecodeRegressor(top_k=0, num_experts=0).fit(x, y).coef_)
    return DecodeValidation(
        coef,
        len(y),
        _mean(ape),
        _buckets(kv, ape, KV_BUCKETS),
        _buckets(x[:, 0], ape, BATCH_BUCKETS),
        float(np.mean(per_level)),
        float(np.max(per_level)),
    )


class ProfileReport(NamedTuple):
    name: str
    notes: tuple[str, ...]
    prefill: PrefillValidation
    decode: DecodeValidation
    decode_reliable: bool


def validate(name: str, root: Path | None = None, folds: int = 5, seed: int = 0) -> ProfileReport:
    """Compose, fit and cross-validate both phases of one hardware profile."""
    profile = load_profile(name, root)
    pre = validate_prefill(compose_prefill(profile, seed=seed), folds, seed)
    dec = validate_decode(compose_decode(profile), folds, seed)
    return ProfileReport(name, profile.notes, pre, dec, profile.decode_reliable)


def format_report(report: ProfileReport) -> str:
    """A plain-text table of the held-out errors (percent)."""
    p, d = report.prefill, report.decode
    lines = [f"== {report.name}: prefill, {p.points} iterations, {len(p.by_tokens)} size buckets"]
    lines += [f"   note: {n}" for n in report.notes]
    lines.append(f"   coef c0..c3 = {', '.join(f'{c:.4g}' for c in p.coef)} s")
    lines.append(
        f"   held-out MAPE: all {100 * p.mape:.2f}%  single {100 * p.mape_single:.2f}%  batch {100 * p.mape_batch:.2f}%"
    )
    lines.append(
        f"   >= {SERVING_MIN_TOKENS} tokens: all {100 * p.serving_mape:.2f}%  single "
        f"{100 * p.serving_mape_single:.2f}%  batch {100 * p.serving_mape_batch:.2f}%"
    )
    for kind, (m, s) in p.separate.items():
        lines.append(
            f"   fitted on {kind} only: {100 * m:.2f}% (>= {SERVING_MIN_TOKENS}: {100 * s:.2f}%)"
        )
    lines.append(
        f"   fitted on >= {SERVING_MIN_TOKENS}-token iterations only: {100 * p.serving_only_mape:.2f}% "
        f"(coef {', '.join(f'{c:.4g}' for c in p.serving_only_coef)})"
    )
    lines.append("   tokens/iteration   points   MAPE     max APE")
    lines += [
        f"   [{b.lo:>5}, {b.hi:>7})  {b.points:>6}  {100 * b.mape:6.2f}%  {100 * b.max_ape:6.2f}%"
        for b in p.by_tokens
    ]
    flag = "" if report.decode_reliable else " (source data flagged unreliable)"
    lines.append(f"== {report.name}: decode{flag}, {d.points} iterations, dense: phi = 0")
    lines.append(f"   coef d0..d2 = {', '.join(f'{c:.4g}' for c in d.coef)} s")
    lines.append(
        f"   held-out MAPE over all contexts {100 * d.mape:.2f}%; fixed context (per-kv fits) "
        f"mean {100 * d.fixed_context_mape:.2f}%, worst {100 * d.fixed_context_worst:.2f}%"
    )
    lines.append("   kv tokens/request   points   MAPE     max APE")
    lines += [
        f"   [{b.lo:>5}, {b.hi:>7})  {b.points:>6}  {100 * b.mape:6.2f}%  {100 * b.max_ape:6.2f}%"
        for b in d.by_kv
    ]
    lines.append("   batch size          points   MAPE     max APE")
    lines += [
        f"   [{b.lo:>5}, {b.hi:>7}]  {b.points:>6}  {100 * b.mape:6.2f}%  {100 * b.max_ape:6.2f}%"
        for b in d.by_batch
    ]
    return "\n".join(lines)
