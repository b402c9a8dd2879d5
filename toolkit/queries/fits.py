"""Measured vs predicted iteration times per node (paper 000 §5.1, Eq. 1-2; Fig. 5, Fig. B.1).

Coefficients come from `toolkit.fit.run.fit_run` (held-out MAPE in each `PhaseFit`) unless a
`RunFit` is passed. Predictions and bins are computed in DuckDB with the coefficients as
query parameters: the relative error (measured − predicted) / measured per node, binned two
ways in one scan — Σt_uc (half-octaves) and requests per batch for prefill, batch size B
and context tokens per iteration for decode (the context term Eq. 2 omits shows up as a
trend there) — and a per-node hash sample of iterations with their predictions.
`decode_noise` measures how much the pass times of equal decode work vary (the floor under
any model's error: on a shared CPU it is large).
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import numpy as np
import polars as pl

from toolkit.fit.run import FitInputError, PhaseFit, RunFit, fit_run
from toolkit.fit.sql import PHASE_SQL, PhaseSql, values_list
from toolkit.queries.run import Run, hash_sample

BINS_PER_OCTAVE = 2  # token bins are half-octaves: fine enough to show a trend, >10 rows each
Phase = Literal["prefill", "decode"]


def _log_bin(col: str) -> str:
    return f"floor(log2(greatest({col}, 1)) * {BINS_PER_OCTAVE})"


# Per phase: the two binnings (name -> (bin key SQL, binned quantity SQL)) and the columns
# of the sampled iterations.
_DIMS: dict[str, dict[str, tuple[str, str]]] = {
    "prefill": {
        "tokens": (_log_bin("t.t_uc"), "t.t_uc::DOUBLE"),
        "batch": ("t.num_reqs", "t.num_reqs::DOUBLE"),
    },
    "decode": {
        "batch": ("t.batch_size", "t.batch_size::DOUBLE"),
        "tokens": (_log_bin("t.ctx_tokens"), "t.ctx_tokens::DOUBLE"),
    },
}
_SAMPLE_COLUMNS = {
    "prefill": "t.t_uc, t.attn_pairs, t.t_rst, t.num_reqs",
    "decode": "t.batch_size, t.t_fwd, t.ctx_tokens",
}


class FitData(NamedTuple):
    run_id: str
    phase: Phase
    fits: dict[int, PhaseFit]  # the nodes whose model was fitted
    not_fitted: list[str]  # 'node N: why' for nodes with data but no model
    # node_id, dim (a binning of _DIMS), x (mean of the binned quantity), n, y_mean (measured
    # s), rel_err and rel_sd of (measured − predicted) / measured
    stats: pl.DataFrame
    points: pl.DataFrame  # node_id, iter_id, y (measured s), yhat (predicted s), _SAMPLE_COLUMNS
    counts: dict[int, int]  # valid iterations per node
    shapes: dict[int, tuple[int, int]]  # node -> (moe_top_k, moe_experts)
    t_fwd: dict[int, float]  # node -> mean t_fwd of its decode iterations
    sample: int  # the cap on points per node
    missing: str | None


def _fits(run: Run, fit: RunFit | None, phase: str) -> tuple[dict[int, PhaseFit], list[str]]:
    """The successful fits of `phase` per node, and notes for nodes that failed."""
    if fit is None:
        fit = fit_run(run.reader, run.run_id, bootstrap=0)
    elif fit.run_id != run.run_id:
        raise ValueError(f"the RunFit passed is of run {fit.run_id!r}, not {run.run_id!r}")
    ok: dict[int, PhaseFit] = {}
    notes = []
    for node in fit.nodes:
        pf = node.prefill if phase == "prefill" else node.decode
        if pf.ok:
            ok[node.node_id] = pf
        elif pf.samples or pf.samples_test:
            notes.append(f"node {node.node_id}: {pf.message}")
    return ok, notes


def _model_sql(
    spec: PhaseSql, fits: dict[int, PhaseFit], shapes: dict[int, tuple[int, int]]
) -> tuple[str, str, list[Any]]:
    """(FROM clause joining the coefficients, prediction expression, its parameters)."""
    rows = []
    for n, f in fits.items():
        k, e = shapes.get(n, (0, 0))
        log_base = float(np.log1p(-k / e)) if e > 0 and 0 < k <= e else 0.0
        rows.append((n, *(f.coef or ()), log_base))
    cols = ["node_id", *(f"c{i}" for i in range(len(spec.terms))), "log_base"]
    values, params = values_list(rows, cols)
    pred = " + ".join(["m.c0", *(f"m.c{i + 1} * ({f})" for i, f in enumerate(spec.features))])
    source = f"{spec.table} t JOIN {values} ON m.node_id = t.node_id"
    return source, pred, params


def _binned(
    run: Run,
    source: str,
    pred: str,
    params: list[Any],
    spec: PhaseSql,
    dims: dict[str, tuple[str, str]],
) -> pl.DataFrame:
    """Relative error statistics per node and bin for each binning in `dims`, in one scan.

    `dims` maps a name to (SQL of the bin key, SQL of the binned quantity); x is the mean of
    the quantity within the bin. Every binning covers every valid row once.
    """
    cols = ", ".join(f"{key} AS k_{name}, {x} AS x_{name}" for name, (key, x) in dims.items())
    sets = ", ".join(f"(node_id, k_{name})" for name in dims)
    dim = " ".join(f"WHEN grouping(k_{name}) = 0 THEN '{name}'" for name in dims)
    xs = " ".join(f"WHEN grouping(k_{name}) = 0 THEN avg(x_{name})" for name in dims)
    q = f"""
        SELECT node_id, CASE {dim} END AS dim, CASE {xs} END AS x, count(*) AS n,
               avg(y) AS y_mean, avg(r) AS rel_err, coalesce(stddev_samp(r), 0) AS rel_sd
        FROM (
            SELECT t.node_id, t.duration_s AS y, (t.duration_s - ({pred})) / t.duration_s AS r,
                   {cols}
            FROM {source}
            WHERE t.run_id = ? AND coalesce({spec.valid}, false)
        )
        GROUP BY GROUPING SETS ({sets})
        ORDER BY node_id, dim, x
    """
    return run.df(q, [*params, run.run_id])


def _sample(
    run: Run,
    source: str,
    pred: str,
    params: list[Any],
    spec: PhaseSql,
    counts: dict[int, int],
    columns: str,
    limit: int,
) -> pl.DataFrame:
    where, sparams = hash_sample("t.node_id, t.iter_id", counts, "t.node_id", limit)
    q = f"""
        SELECT t.node_id, t.iter_id, t.duration_s AS y, {pred} AS yhat, {columns}
        FROM {source}
        WHERE t.run_id = ? AND coalesce({spec.valid}, false) AND {where}
        QUALIFY row_number() OVER (PARTITION BY t.node_id ORDER BY hash(t.node_id, t.iter_id)) <= ?
        ORDER BY t.node_id, t.iter_id
    """
    return run.df(q, [*params, run.run_id, *sparams, limit])


def _counts(stats: pl.DataFrame) -> dict[int, int]:
    """Rows per node (from one binning, which covers every row once)."""
    first = stats["dim"][0] if stats.height else None
    part = stats.filter(pl.col("dim") == first)
    return {int(n): int(c) for n, c in part.group_by("node_id").agg(pl.col("n").sum()).iter_rows()}


def fit_data(run: Run, phase: Phase, *, fit: RunFit | None = None, sample: int = 1500) -> FitData:
    """Fits, binned relative errors and sampled points of one phase's model per node.

    `fit` reuses a `fit_run` result of this run; `sample` caps the sampled points per node.
    """
    shapes = {
        int(r["node_id"]): (int(r["moe_top_k"] or 0), int(r["moe_experts"] or 0))
        for r in run.nodes().iter_rows(named=True)
    }

    def nothing(message: str) -> FitData:
        empty = pl.DataFrame()
        return FitData(run.run_id, phase, {}, [], empty, empty, {}, shapes, {}, sample, message)

    if run.count(f"{phase}_iterations") == 0:
        return nothing(f"no {phase} iterations logged in run {run.run_id}")
    try:
        fits, notes = _fits(run, fit, phase)
    except FitInputError as exc:
        return nothing(f"cannot fit run {run.run_id}: {exc}")
    if not fits:
        return nothing(f"no node's {phase} model could be fitted: " + "; ".join(notes))
    spec = PHASE_SQL[phase]
    source, pred, params = _model_sql(spec, fits, shapes)
    stats = _binned(run, source, pred, params, spec, _DIMS[phase])
    counts = _counts(stats)
    points = _sample(run, source, pred, params, spec, counts, _SAMPLE_COLUMNS[phase], sample)
    t_fwd: dict[int, float] = {}
    if phase == "decode":
        rows = run.rows(
            "SELECT node_id, avg(t_fwd) FROM decode_iterations WHERE run_id = ? GROUP BY node_id",
            [run.run_id],
        )
        t_fwd = {int(n): float(v) for n, v in rows if v is not None}
    return FitData(
        run.run_id, phase, fits, notes, stats, points, counts, shapes, t_fwd, sample, None
    )


def decode_noise(run: Run, min_iterations: int = 20) -> pl.DataFrame:
    """Spread of decode pass times at equal work: per node and batch size B (with at least
    `min_iterations` passes), the mean time in ms, the coefficient of variation (std / mean)
    and p90 / p10. Eq. 2 predicts one time per (B, t_fwd), so this spread bounds its MAPE."""
    return run.df(
        "SELECT node_id, batch_size, count(*) AS iterations, "
        "1000 * avg(duration_s) AS mean_ms, stddev_samp(duration_s) / avg(duration_s) AS cv, "
        "quantile_cont(duration_s, 0.9) / quantile_cont(duration_s, 0.1) AS p90_over_p10 "
        "FROM decode_iterations WHERE run_id = ? AND duration_s > 0 "
        "GROUP BY node_id, batch_size HAVING count(*) >= ? ORDER BY node_id, batch_size",
        [run.run_id, min_iterations],
    )
