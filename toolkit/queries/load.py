"""Per-node queueing and load balance of a run (SPEC §5 metrics; paper 000 §5.3 router, §6).

Over the measured period (after the warmup unless `include_warmup`):
- busy: Σ iteration durations of each phase on each node;
- waits: the prefill queue wait t_prefill_start − t_arrival of the requests each node
  prefilled, as box statistics (P5, quartiles, P95, mean) computed in DuckDB;
- trend: the mean queue wait per node per time bin of arrival;
- batch: the time-averaged running batch of each node's decode iterations, Σ B·T / Σ T;
and the imbalance max/mean of the nodes' mean queue waits (as the run summary's
prefill_queue_imbalance) and of their decode batches.
"""

from __future__ import annotations

from typing import NamedTuple

import polars as pl

from toolkit.queries.run import Run, switch_lines, time_bin_width


class LoadData(NamedTuple):
    run_id: str
    t0: float  # start of the measured period
    include_warmup: bool
    span_s: float  # length of the measured period
    width_s: float  # trend bin width
    busy: pl.DataFrame  # node_id, phase, busy_s
    waits: pl.DataFrame  # node_id, n, mean_s, q = [P5, P25, P50, P75, P95]
    trend: pl.DataFrame  # node_id, t_bin, mean_s, n
    batch: pl.DataFrame  # node_id, mean_batch, iterations
    switch_times: list[float]  # completed phase switches in the period
    wait_imbalance: float | None
    batch_imbalance: float | None
    missing: str | None


def imbalance(values: list[float]) -> float | None:
    """max / mean of the values (None without positive values)."""
    vals = [v for v in values if v is not None]
    if not vals or sum(vals) <= 0:
        return None
    return max(vals) / (sum(vals) / len(vals))


def load_data(run: Run, *, bins: int = 40, include_warmup: bool = False) -> LoadData:
    """Busy time, queue-wait statistics and trend, and decode batch per node."""
    t0 = 0.0 if include_warmup else run.warmup_s()
    span = max(run.t_end() - t0, 1e-9)
    busy = run.df(
        """
        SELECT node_id, 'prefill' AS phase, sum(duration_s) AS busy_s FROM prefill_iterations
        WHERE run_id = ? AND t_start >= ? GROUP BY ALL
        UNION ALL
        SELECT node_id, 'decode', sum(duration_s) FROM decode_iterations
        WHERE run_id = ? AND t_start >= ? GROUP BY ALL
        ORDER BY node_id, phase
        """,
        [run.run_id, t0, run.run_id, t0],
    )
    waits = run.df(
        """
        WITH w AS (
            SELECT prefill_node AS node_id, t_arrival, t_prefill_start - t_arrival AS wait_s
            FROM requests WHERE run_id = ? AND t_arrival >= ? AND t_prefill_start IS NOT NULL
              AND prefill_node IS NOT NULL
        )
        SELECT node_id, count(*) AS n, avg(wait_s) AS mean_s,
               quantile_cont(wait_s, [0.05, 0.25, 0.5, 0.75, 0.95]) AS q
        FROM w GROUP BY node_id ORDER BY node_id
        """,
        [run.run_id, t0],
    )
    width = time_bin_width(span, bins)
    trend = run.df(
        """
        SELECT prefill_node AS node_id, floor((t_arrival - ?) / ?) * ? + ? AS t_bin,
               avg(t_prefill_start - t_arrival) AS mean_s, count(*) AS n
        FROM requests WHERE run_id = ? AND t_arrival >= ? AND t_prefill_start IS NOT NULL
          AND prefill_node IS NOT NULL
        GROUP BY ALL ORDER BY node_id, t_bin
        """,
        [t0, width, width, t0, run.run_id, t0],
    )
    batch = run.df(
        """
        SELECT node_id, sum(batch_size * duration_s) / sum(duration_s) AS mean_batch,
               count(*) AS iterations
        FROM decode_iterations WHERE run_id = ? AND t_start >= ? GROUP BY 1 ORDER BY 1
        """,
        [run.run_id, t0],
    )
    lines = [t for t in switch_lines(run) if t >= t0]
    missing = None
    if busy.is_empty() and waits.is_empty():
        missing = f"no iterations or prefilled requests logged in run {run.run_id}"
    return LoadData(
        run.run_id,
        t0,
        include_warmup,
        span,
        width,
        busy,
        waits,
        trend,
        batch,
        lines,
        imbalance(waits["mean_s"].to_list()) if waits.height else None,
        imbalance(batch["mean_batch"].to_list()) if batch.height else None,
        missing,
    )
