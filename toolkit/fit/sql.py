"""SQL passes that reduce iteration logs to Gram statistics and held-out errors (paper 000 §5.1).

Fitting Eq. 1-2 needs, per node, only G = sum x x^T / y^2 and b = sum x / y over the training
rows (models.fitting.GramStats). `aggregate` computes them in one DuckDB pass per phase,
grouped by node, validity, held-out flag and bootstrap bucket (a hash of (node_id, iter_id)),
so a 10M-row log becomes a few hundred rows. `heldout_mape` is the second pass: MAPE over the
held-out rows with the fitted coefficients passed as query parameters. Sums use fsum
(compensated summation) so that the same rows give bit-identical results on every refit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from models.fitting import DECODE_TERMS, PREFILL_TERMS, GramStats

HASH_MOD = 10_000  # held-out split resolution: holdout is rounded to 1e-4
NUM_BUCKETS = 64  # bootstrap resamples these hash buckets of training rows


@dataclass(frozen=True, slots=True)
class PhaseSql:
    """How one phase's rows become features x (the model's design row) and validity."""

    table: str
    terms: tuple[str, ...]
    features: tuple[str, ...]  # SQL for x_1..x_{p-1}; x_0 is the constant 1
    valid: str
    needs_moe: bool
    target: str = "t.duration_s"  # what the row's features predict (t.cpu_s: CPU time)


PREFILL_SQL = PhaseSql(
    table="prefill_iterations",
    terms=PREFILL_TERMS,
    features=("t.t_uc::DOUBLE", "t.attn_pairs::DOUBLE", "t.t_rst::DOUBLE"),
    valid=(
        "t.duration_s > 0 AND isfinite(t.duration_s) AND t.t_uc >= 0 AND t.attn_pairs >= 0 "
        "AND isfinite(t.attn_pairs) AND t.t_rst >= 0"
    ),
    needs_moe=False,
)
# phi(B) = 1 - (1 - k/E)^(t_fwd*B) = 1 - exp(t_fwd*B*ln(1 - k/E)); m.log_base = ln(1 - k/E),
# 0 for a dense node (phi = 0).
DECODE_SQL = PhaseSql(
    table="decode_iterations",
    terms=DECODE_TERMS,
    features=("1.0 - exp(t.t_fwd * t.batch_size * m.log_base)", "t.batch_size::DOUBLE"),
    valid="t.duration_s > 0 AND isfinite(t.duration_s) AND t.batch_size > 0 AND t.t_fwd > 0 AND isfinite(t.t_fwd)",
    needs_moe=True,
)
PHASE_SQL = {"prefill": PREFILL_SQL, "decode": DECODE_SQL}


@dataclass(slots=True)
class Agg:
    """Accumulated Gram statistics of one node and phase (training rows per bucket)."""

    buckets: list[GramStats] = field(default_factory=list)
    num_train: int = 0
    num_test: int = 0
    num_invalid: int = 0

    def train(self, p: int) -> GramStats:
        total = GramStats.zeros(p)
        for b in self.buckets:
            total = total + b
        return total


def values_list(
    rows: Sequence[Sequence[float | int]], names: Sequence[str]
) -> tuple[str, list[Any]]:
    """A parameterized VALUES list `(VALUES (?::INTEGER, ?::DOUBLE, ...), ...) m(names)`."""
    casts = ", ".join(["?::INTEGER"] + ["?::DOUBLE"] * (len(names) - 1))
    body = ", ".join(f"({casts})" for _ in rows)
    return f"(VALUES {body}) AS m({', '.join(names)})", [v for r in rows for v in r]


def aggregate(
    con: Any,
    spec: PhaseSql,
    run_id: str,
    node_ids: Sequence[int] | None,
    threshold: int,
    log_base: dict[int, float],
    bucket_sql: str | None = None,
) -> dict[int, Agg]:
    """Per-node Gram statistics of one phase, by validity, held-out flag and bucket.

    Buckets are hash buckets of (node_id, iter_id) unless `bucket_sql` gives another
    grouping of the training rows (an SQL expression over `t`, e.g. time windows).
    """
    p = len(spec.terms)
    feats = ["w", *(f"({f}) * w" for f in spec.features)]  # x_i / y
    names = [f"x{i}" for i in range(p)]
    pairs = [(i, j) for i in range(p) for j in range(i, p)]
    sums = [f"fsum({names[i]} * {names[j]})" for i, j in pairs] + [f"fsum({n})" for n in names]
    params: list[Any] = []
    join = ""
    if spec.needs_moe:
        # Nodes without a usable MoE shape are absent from m: their x's are NULL and only
        # their row counts are used (for the message).
        shapes = list(log_base.items()) or [(-1, 0.0)]
        values, params = values_list(shapes, ("node_id", "log_base"))
        join = f"LEFT JOIN {values} ON m.node_id = t.node_id"
    node_filter = ""
    if node_ids is not None:
        node_filter = f" AND t.node_id IN ({', '.join('?' for _ in node_ids)})"
    sql = f"""
        WITH s AS (
            SELECT t.node_id AS node_id,
                   hash(t.node_id, t.iter_id) AS h,
                   {bucket_sql or "NULL"} AS tb,
                   coalesce({spec.valid}, false) AS ok,
                   CASE WHEN ok THEN 1.0 / {spec.target} END AS w,
                   {", ".join(f"{f} AS {n}" for f, n in zip(feats, names, strict=True))}
            FROM {spec.table} t {join}
            WHERE t.run_id = ?{node_filter}
        )
        SELECT node_id, ok, (h % {HASH_MOD}) < ? AS test,
               {"tb" if bucket_sql else f"(h // {HASH_MOD}) % {NUM_BUCKETS}"} AS bucket,
               count(*) AS n, {", ".join(sums)}
        FROM s GROUP BY ALL
    """
    args = [*params, run_id, *(node_ids or []), threshold]
    out: dict[int, Agg] = {}
    result: list[tuple[Any, ...]] = con.execute(sql, args).fetchall()
    rows = sorted(result, key=lambda r: (r[0], r[1], r[2], r[3]))
    for node, ok, test, _bucket, n, *vals in rows:
        agg = out.setdefault(int(node), Agg())
        if not ok:
            agg.num_invalid += n
        elif test:
            agg.num_test += n
        else:
            agg.num_train += n
            if vals[0] is not None:  # NULL: a decode node without MoE shape, counted only
                xtx = np.zeros((p, p))
                for (i, j), v in zip(pairs, vals, strict=False):
                    xtx[i, j] = xtx[j, i] = v
                xty = np.asarray(vals[len(pairs) :], dtype=np.float64)
                agg.buckets.append(GramStats(xtx, xty, float(n), int(n)))
    return out


def heldout_mape(
    con: Any,
    spec: PhaseSql,
    run_id: str,
    threshold: int,
    coefs: dict[int, tuple[float, ...]],
    log_base: dict[int, float],
) -> dict[int, tuple[int, float]]:
    """Held-out MAPE per node: second pass over the held-out rows only."""
    if not coefs or threshold <= 0:
        return {}
    p = len(spec.terms)
    cols = ["node_id", *(f"c{i}" for i in range(p)), "log_base"]
    rows = [(n, *c, log_base.get(n, 0.0)) for n, c in coefs.items()]
    values, params = values_list(rows, cols)
    pred = " + ".join(["m.c0", *(f"m.c{i + 1} * ({f})" for i, f in enumerate(spec.features))])
    sql = f"""
        SELECT t.node_id, count(*), fsum(abs(({pred}) - {spec.target}) / {spec.target})
        FROM {spec.table} t JOIN {values} ON m.node_id = t.node_id
        WHERE t.run_id = ? AND coalesce({spec.valid}, false) AND hash(t.node_id, t.iter_id) % {HASH_MOD} < ?
        GROUP BY t.node_id
    """
    res = con.execute(sql, [*params, run_id, threshold]).fetchall()
    return {int(n): (int(c), float(s) / c) for n, c, s in res if c}
