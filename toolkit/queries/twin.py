"""A twin run beside the run it replays: per-request TTFT, TPOT and E2E, real and simulated.

A run written by `pdlab twin` (source 'twin') names the run it replays in its config
(`twin_of`); both live in the same database. `twin_pairs` joins their requests by id:
TTFT = t_first_token - t_arrival, TPOT = (t_done - t_first_token) / (t_out - 1) (NULL for
one-token requests), E2E = t_done - t_arrival, as toolkit.queries.serving defines them.
"""

from __future__ import annotations

from typing import NamedTuple

import polars as pl

from toolkit.queries.run import Run

METRICS = {
    "ttft": "{r}.t_first_token - {r}.t_arrival",
    "tpot": "CASE WHEN {r}.t_out > 1 THEN ({r}.t_done - {r}.t_first_token) / ({r}.t_out - 1) END",
    "e2e": "{r}.t_done - {r}.t_arrival",
}


class TwinPairs(NamedTuple):
    """Per request: request_id, t_arrival, <metric>_real and <metric>_sim for each metric;
    `missing` says why there is nothing (not a twin run, its real run gone)."""

    run_id: str
    real_run_id: str | None
    pairs: pl.DataFrame
    missing: str | None
    forced: bool = False  # made with `pdlab twin --force` (a profile of another model/GPU)


def twin_pairs(run: Run) -> TwinPairs:
    config = run.config()
    real = config.get("twin_of")
    if not isinstance(real, str):
        return TwinPairs(
            run.run_id, None, pl.DataFrame(), "no twin: this run was not written by `pdlab twin`"
        )
    cols = ", ".join(
        f"{expr.format(r='r')} AS {m}_real, {expr.format(r='s')} AS {m}_sim"
        for m, expr in METRICS.items()
    )
    df = run.df(
        f"SELECT s.request_id, s.t_arrival, {cols} FROM requests s JOIN requests r "
        "ON r.request_id = s.request_id AND r.run_id = ? WHERE s.run_id = ? "
        "AND s.t_done IS NOT NULL AND r.t_done IS NOT NULL ORDER BY s.t_arrival, s.request_id",
        [real, run.run_id],
    )
    missing = None if df.height else f"no requests shared with run {real!r}"
    return TwinPairs(run.run_id, real, df, missing, bool(config.get("forced", False)))
