"""A metric of several policies (or sweep points) over seeds, with 95% intervals.

Each policy ran under the same seeds (the same programs and arrivals), one row per policy
and seed. `seed_intervals` gives per policy the mean over seeds and a Student-t interval,
mean ± t(0.975, n−1)·s/√n (n seeds, s their sample standard deviation; none for a single
seed), and, against a baseline policy, the change of the mean paired by seed: the mean of
x_seed / baseline_seed − 1 with the same t interval over seeds (pairing removes the
workload's seed-to-seed variation, which the unpaired intervals keep). Policies are ranked
by their mean (`lower_is_better` says which way). Plain polars and scipy; no plotly.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import polars as pl
from scipy import stats

LEVEL = 0.95


class SeedIntervals(NamedTuple):
    metric: str
    # policy, seeds, mean, lo, hi, values (per seed, by seed), rank (1 = best),
    # change, change_lo, change_hi (vs the baseline, paired by seed; None without it)
    table: pl.DataFrame
    baseline: str | None
    lower_is_better: bool
    level: float


def t_interval(
    values: Sequence[float], level: float = LEVEL
) -> tuple[float, float | None, float | None]:
    """(mean, lo, hi) of a Student-t interval; lo, hi None for fewer than 2 values."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if x.size == 0:
        return math.nan, None, None
    mean = float(x.mean())
    if x.size < 2:
        return mean, None, None
    half = float(stats.t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return mean, mean - half, mean + half


def seed_intervals(
    rows: pl.DataFrame | Sequence[Mapping[str, Any]],
    metric: str,
    *,
    policy: str = "policy",
    seed: str = "seed",
    baseline: str | None = None,
    lower_is_better: bool = True,
    level: float = LEVEL,
) -> SeedIntervals:
    """Per policy: mean of `metric` over seeds with its interval, rank, paired change."""
    df = rows if isinstance(rows, pl.DataFrame) else pl.DataFrame(list(rows))
    for col in (policy, seed, metric):
        if col not in df.columns:
            raise ValueError(f"rows have no column {col!r}; columns: {', '.join(df.columns)}")
    df = df.select(pl.col(policy).cast(pl.Utf8), seed, pl.col(metric).cast(pl.Float64))
    if baseline is not None and baseline not in df[policy].to_list():
        raise ValueError(f"baseline {baseline!r} is not one of the policies")
    base = (
        dict(df.filter(pl.col(policy) == baseline).select(seed, metric).iter_rows())
        if baseline is not None
        else {}
    )
    out = []
    for name in dict.fromkeys(df[policy].to_list()):  # first-seen order
        mine = df.filter(pl.col(policy) == name).sort(seed)
        values = mine[metric].to_list()
        mean, lo, hi = t_interval(values, level)
        change: tuple[float | None, float | None, float | None] = (None, None, None)
        if base and name != baseline:
            ratios = [
                v / base[s] - 1.0
                for s, v in mine.select(seed, metric).iter_rows()
                if v is not None and base.get(s)
            ]
            change = t_interval(ratios, level) if ratios else change
        elif base:
            change = (0.0, None, None)
        out.append(
            {"policy": name, "seeds": len(values), "mean": mean, "lo": lo, "hi": hi,
             "values": values, "change": change[0], "change_lo": change[1],
             "change_hi": change[2]}
        )  # fmt: skip
    table = pl.DataFrame(out).with_columns(
        rank=pl.col("mean").rank("min", descending=not lower_is_better).cast(pl.Int64)
    )
    return SeedIntervals(metric, table.sort("rank"), baseline, lower_is_better, level)


def sweep_rows(results: pl.DataFrame | Sequence[Mapping[str, Any]], metric: str) -> pl.DataFrame:
    """point, seed, `metric` and a `policy` naming each point by its parameters
    ("retention=lru, scheduling=plas"; "point N" without any) of sweep rows: the
    `sweep_results` table's (params as JSON) or `run_points`' (params as a dict)."""
    rows = results.to_dicts() if isinstance(results, pl.DataFrame) else list(results)

    def label(r: Mapping[str, Any]) -> str:
        got = r.get("params") or {}
        got = json.loads(got) if isinstance(got, str) else got
        return ", ".join(f"{k}={v}" for k, v in got.items()) or f"point {r['point']}"

    return pl.DataFrame(
        {
            "point": [int(r["point"]) for r in rows],
            "seed": [int(r["seed"]) for r in rows],
            "policy": [label(r) for r in rows],
            metric: [r.get(metric) for r in rows],
        },
        schema={"point": pl.Int64, "seed": pl.Int64, "policy": pl.Utf8, metric: pl.Float64},
    )
