"""How far an iteration priced from a measured operator grid may be off (the twin's interval).

Held-out error of the grid (`grid_residuals`): every interior measured point of a table is
predicted by linear interpolation from its two neighbours without it (the pricer's own rule,
on a grid twice as coarse), as a relative residual y / y_hat - 1. Those residuals mix the
measurement's noise (the profiler times three forwards per point) with the curvature linear
interpolation misses. A point's noise shows along every axis alike while curvature differs
by axis, so the attention grid's residuals are taken along its least curved axis (the one
with the smallest RMS residual). The residual of a midpoint has about 1.5x the variance of
one point's noise (its own plus a quarter of each neighbour's), hence `NOISE_SCALE`.

`perturbed(tables, residuals, rng)` is one draw of what the grid could have measured: every
point of every table multiplied by 1 + r * NOISE_SCALE, r drawn from its table's held-out
residuals. Replaying on a few draws spreads the twin's metrics as the profile's measurement
error does (toolkit.twin.interval); errors of different points partly cancel over the
thousands of iterations of a replay, errors of the few cells a replay dwells in do not.

`kernel_gap_s(tables, shape)`: the most CUDA graphs can save per iteration against the eager
profile, one launch gap per profiled kernel: per layer its dense operators (layernorm twice),
attention and the MoE block, plus the per-iteration and per-sequence operators, each gap at
most the profile's cheapest call (an embedding or final norm of one token: a kernel that
does almost nothing). The engine's compiled graphs also fuse elementwise operators, which
this bound leaves out; the profile notes it was timed in eager mode.

`moe_composed(tables)`: whether the MoE block was composed from separately timed operators
(the layers.csv layout: router, one expert's projections by routed tokens, activation;
cluster.hardware.layer_tables) rather than measured as the engine runs it (moe.csv: the
whole block). The engine's fused MoE (routing, token permutation, grouped GEMMs) was then
not measured at all, so nothing bounds how far the composition is off: the twin's interval
says "not known" (toolkit.twin.parameters `moe_block`). `with_moe_scaled` multiplies the
block's times.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_tables import PER_ITERATION, PER_LAYER_COUNT, OperatorTables, Table1D

FloatArray = npt.NDArray[np.float64]
NOISE_SCALE = 1.0 / math.sqrt(1.5)
PER_SEQUENCE_OPS = frozenset({"lm_head", "sampler"})
ATTENTION_AXES = ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode")


class GridResiduals(NamedTuple):
    """Held-out relative residuals per table (module docstring)."""

    dense_layer: FloatArray
    dense_iter: FloatArray
    per_seq: FloatArray
    attention: FloatArray
    attention_axis: str  # the axis the attention residuals were taken along
    moe: FloatArray | None

    def rms(self) -> dict[str, float]:
        out = {
            "dense_layer": _rms(self.dense_layer),
            "dense_iter": _rms(self.dense_iter),
            "per_seq": _rms(self.per_seq),
            "attention": _rms(self.attention),
        }
        if self.moe is not None:
            out["moe"] = _rms(self.moe)
        return out


def _rms(r: FloatArray) -> float:
    return float(np.sqrt(np.mean(r**2))) if r.size else 0.0


def leave_one_out(x: FloatArray, y: FloatArray) -> FloatArray:
    """y / (linear interpolation of each interior point from its neighbours) - 1."""
    if len(x) < 3:
        return np.zeros(0)
    xm, x0, xp, ym, yp = x[:-2], x[1:-1], x[2:], y[:-2], y[2:]
    pred = ym + (yp - ym) * (x0 - xm) / (xp - xm)
    ok = pred > 0
    return np.asarray(y[1:-1][ok] / pred[ok] - 1.0)


def _along(rows: FloatArray, axis: int, value: int) -> FloatArray:
    """Leave-one-out residuals of `rows[:, value]` along column `axis`, the others fixed."""
    others = [c for c in range(rows.shape[1] - 1) if c != axis]
    groups: dict[tuple[float, ...], list[tuple[float, float]]] = defaultdict(list)
    for row in rows.tolist():
        groups[tuple(row[c] for c in others)].append((row[axis], row[value]))
    out = []
    for pts in groups.values():
        if len(pts) >= 3:
            pts.sort()
            a = np.asarray(pts)
            out.append(leave_one_out(a[:, 0], a[:, 1]))
    return np.concatenate(out) if out else np.zeros(0)


def grid_residuals(tables: OperatorTables) -> GridResiduals:
    """Held-out residuals of every table (module docstring)."""
    att = {
        name: _along(tables.attention, i, 4)
        for i, name in enumerate(ATTENTION_AXES)
        if len(np.unique(tables.attention[:, i])) >= 3
    }
    axis = min(att, key=lambda k: _rms(att[k])) if att else ATTENTION_AXES[-1]
    moe = None
    if tables.moe is not None:
        m = [_along(tables.moe, i, 2) for i in range(2)]
        moe = min(m, key=_rms)
    return GridResiduals(
        leave_one_out(tables.dense_layer.x, tables.dense_layer.y),
        leave_one_out(tables.dense_iter.x, tables.dense_iter.y),
        leave_one_out(tables.per_seq.x, tables.per_seq.y),
        att.get(axis, np.zeros(0)),
        axis,
        moe,
    )


def _draw(residuals: FloatArray, n: int, rng: np.random.Generator) -> FloatArray:
    if residuals.size == 0:
        return np.ones(n)
    r = rng.choice(residuals, size=n) * NOISE_SCALE
    return np.maximum(1.0 + r, 0.05)  # a time stays positive


def perturbed(
    tables: OperatorTables, residuals: GridResiduals, rng: np.random.Generator
) -> OperatorTables:
    """One draw of the grid under its measurement error (module docstring)."""

    def table(t: Table1D, r: FloatArray) -> Table1D:
        return Table1D(t.x, t.y * _draw(r, len(t.y), rng))

    att = tables.attention.copy()
    att[:, 4] *= _draw(residuals.attention, len(att), rng)
    moe = None
    if tables.moe is not None:
        moe = tables.moe.copy()
        moe[:, 2] *= _draw(
            residuals.moe if residuals.moe is not None else np.zeros(0), len(moe), rng
        )
    return replace(
        tables,
        dense_layer=table(tables.dense_layer, residuals.dense_layer),
        dense_iter=table(tables.dense_iter, residuals.dense_iter),
        per_seq=table(tables.per_seq, residuals.per_seq),
        attention=att,
        moe=moe,
    )


def kernel_gap_s(tables: OperatorTables, shape: ModelShape) -> float:
    """Upper bound of the launch gaps CUDA graphs remove per iteration (module docstring)."""
    per_layer = 1 + (1 if tables.moe is not None else 0)  # attention, MoE block
    per_iteration = 0
    for op in tables.ops:
        if op in PER_ITERATION or op in PER_SEQUENCE_OPS:
            per_iteration += 1
        else:
            per_layer += PER_LAYER_COUNT.get(op, 1)
    iter_ops = sum(1 for op in tables.ops if op in PER_ITERATION)
    floors = [float(tables.attention[:, 4].min())]
    if iter_ops and tables.dense_iter.y.size:
        floors.append(float(tables.dense_iter.y[0]) / iter_ops)
    return (shape.num_layers * per_layer + per_iteration) * min(floors)


EXPERT_OPS = ("expert.w1", "expert.w2", "expert.w3")


def moe_composed(tables: OperatorTables) -> bool:
    """Whether the MoE block was composed from per-expert operators (module docstring)."""
    return tables.moe is not None and any(op in EXPERT_OPS for op in tables.ops)


def with_moe_scaled(tables: OperatorTables, factor: float) -> OperatorTables:
    """`tables` with every MoE block time multiplied by `factor`."""
    if tables.moe is None:
        return tables
    moe = tables.moe.copy()
    moe[:, 2] *= factor
    return replace(tables, moe=moe)
