"""A `pdlab validate silicon` run's rows: measured against the twin and AIConfigurator.

`silicon_points` reads the run's `silicon_validation` rows that pdlab replayed: per row the
partition, the measured mean TTFT and TPOT and both tools' predictions (AIConfigurator's
NULL where it gave none); `missing` says why there is nothing (not such a run, no row
replayed).
"""

from __future__ import annotations

from typing import NamedTuple

import polars as pl

from toolkit.queries.run import Run


class SiliconPoints(NamedTuple):
    run_id: str
    points: pl.DataFrame  # partition, ttft_ms, tpot_ms, pdlab_*, aic_*
    missing: str | None


def silicon_points(run: Run) -> SiliconPoints:
    if not run.count("silicon_validation"):
        return SiliconPoints(run.run_id, pl.DataFrame(), "no silicon_validation rows in this run")
    df = run.df(
        "SELECT partition, row_id, ttft_ms, tpot_ms, pdlab_ttft_ms, pdlab_tpot_ms, "
        "aic_ttft_ms, aic_tpot_ms FROM silicon_validation "
        "WHERE run_id = ? AND pdlab_ttft_ms IS NOT NULL ORDER BY partition, row_id",
        [run.run_id],
    )
    if df.is_empty():
        return SiliconPoints(run.run_id, df, "pdlab replayed no row of this run")
    return SiliconPoints(run.run_id, df, None)
