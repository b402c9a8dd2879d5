"""The planner's gain test per window (paper 000 §5.2, Eq. 6; Alg. E.3 outer loop).

Every planning window logs, per candidate prefill count, the mean and standard deviation of
the per-slice throughput gains g_i = Θ(candidate) − Θ(current) over m slices (Θ in requests
per second, μ = 1/T^req, Eq. 3–5). A candidate qualifies when mean(g) > 2·std(g)/√m;
`planner_data` adds that threshold to each row.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import polars as pl

from toolkit.queries.run import Run


class PlannerData(NamedTuple):
    run_id: str
    # t, current_prefill, candidate_prefill, mean_gain, std_gain, slices, qualified, chosen,
    # threshold (2·std/√m), by window and candidate
    windows: pl.DataFrame
    missing: str | None


def gain_threshold(std_gain: float, slices: int) -> float:
    """2·std/√m, the margin mean(g) must exceed (0 when there are no slices)."""
    return 2.0 * std_gain / math.sqrt(slices) if slices > 0 else 0.0


def planner_data(run: Run) -> PlannerData:
    """The run's planner_windows rows with the gain test's threshold."""
    rows = run.df(
        "SELECT t, current_prefill, candidate_prefill, mean_gain, std_gain, slices, "
        "qualified, chosen "
        "FROM planner_windows WHERE run_id = ? ORDER BY t, candidate_prefill",
        [run.run_id],
    )
    if rows.is_empty():
        missing = (
            f"no planner windows logged in run {run.run_id} "
            "(static planner, or the run ended before the first window)"
        )
        return PlannerData(run.run_id, rows, missing)
    thresholds = [
        gain_threshold(float(s), int(m))
        for s, m in zip(rows["std_gain"], rows["slices"], strict=True)
    ]
    return PlannerData(run.run_id, rows.with_columns(threshold=pl.Series(thresholds)), None)
