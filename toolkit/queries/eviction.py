"""Evictions by tier and time, and which evicted blocks the node needed again (paper 000 §5.3).

Branch-aware eviction evicts host blocks in ascending (1[R_b > 0], T_b): blocks no active
branch references (count 0 on that node) first, LRU within each group. Each `evictions` row
carries the block's count at eviction. Per tier, time bin and referenced flag,
`eviction_data` counts the evicted blocks and those needed again.

"Needed again" (the recompute an eviction caused) is defined as: a later `kv_events` row
'stored' of the same block_hash on the same node and tier (the first one after the
eviction, found by an ASOF join). For the host tier — the node's last copy, since GPU KV
stays within host KV — that block was prefilled again or fetched from a peer; for the GPU
tier it was reloaded (restored from host, fetched or recomputed). Evictions near the run's
end are right-censored: their re-use would fall after the run. Without kv_events (compact
telemetry) only the eviction counts are known.
"""

from __future__ import annotations

from typing import NamedTuple

import polars as pl

from toolkit.queries.run import Run, switch_lines, time_bin_width


class EvictionData(NamedTuple):
    run_id: str
    width_s: float  # time bin width
    # tier, t_bin, referenced (count > 0 at eviction), n, n_again, gap_s (mean time to re-store)
    stats: pl.DataFrame
    has_kv_events: bool  # otherwise n_again is 0 by construction
    switch_times: list[float]
    missing: str | None


def eviction_stats(run: Run, width: float) -> tuple[pl.DataFrame, bool]:
    """Per tier, time bin and referenced flag: evicted blocks, re-stored ones, mean gap (s).

    The flag says whether kv_events were logged (otherwise n_again is 0 by construction).
    """
    has_kv = run.count("kv_events", "kind = 'stored'") > 0
    stats = run.df(
        """
        WITH e AS (
            SELECT t, node_id, tier, block_hash, branch_count > 0 AS referenced
            FROM evictions WHERE run_id = ?
        ), s AS (
            SELECT t, node_id, tier, block_hash FROM kv_events WHERE run_id = ? AND kind = 'stored'
        ), j AS (
            SELECT e.*, s.t AS t_again FROM e ASOF LEFT JOIN s
              ON e.node_id = s.node_id AND e.tier = s.tier AND e.block_hash = s.block_hash
             AND s.t > e.t
        )
        SELECT tier, floor(t / ?) * ? AS t_bin, referenced, count(*) AS n,
               count(t_again) AS n_again, avg(t_again - t) AS gap_s
        FROM j GROUP BY ALL ORDER BY tier, t_bin, referenced
        """,
        [run.run_id, run.run_id, width, width],
    )
    return stats, has_kv


def eviction_data(run: Run, *, bins: int = 60) -> EvictionData:
    """Eviction statistics in `bins` time bins over the run, and its phase switch times."""
    width = time_bin_width(run.t_end(), bins)
    if run.count("evictions") == 0:
        missing = f"no evictions logged in run {run.run_id}"
        return EvictionData(run.run_id, width, pl.DataFrame(), False, [], missing)
    stats, has_kv = eviction_stats(run, width)
    return EvictionData(run.run_id, width, stats, has_kv, switch_lines(run), None)
