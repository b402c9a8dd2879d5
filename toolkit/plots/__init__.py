"""Figure library over pdlab telemetry (SPEC §7 figures; paper 000 Fig. 4, Fig. 5).

Every function takes `(db_or_reader, run_id=None, **options)` — a DuckDB path or a
`telemetry.TelemetryReader` (which also reads runs still being written) — and returns a
`plotly.graph_objects.Figure` with titled axes and units. Each runs one query function of
`toolkit.queries` (large tables reduced in DuckDB: bins, hash samples; testable without
plotly) and one drawing function of its module here (`draw_*`, data in, figure out). A table
without rows gives a figure that says so, a panel without data a message saying why.
`FIGURES` maps a short name to each function, in the order `pdlab report` shows them
(`toolkit.queries.content` picks those a run can fill);
`TWIN_FIGURES` those of a run written by `pdlab twin` (shown for such runs only).
"""

from collections.abc import Callable

import plotly.graph_objects as go

from toolkit.plots.branches import branch_count_tree, branch_counts_over_time
from toolkit.plots.common import is_empty, no_data
from toolkit.plots.eviction import eviction_timeline
from toolkit.plots.fits import decode_fit, prefill_fit
from toolkit.plots.latency import latency_distributions
from toolkit.plots.load import node_load
from toolkit.plots.phi import phi_curve
from toolkit.plots.planner import planner_gains
from toolkit.plots.queue import queue_over_time
from toolkit.plots.reuse import lost_kv_reuse
from toolkit.plots.split import pd_split
from toolkit.plots.timeline import pass_timeline
from toolkit.plots.twin import twin_cdf, twin_scatter
from toolkit.plots.validation import validation_series

FIGURES: dict[str, Callable[..., go.Figure]] = {
    "split": pd_split,
    "latency": latency_distributions,
    "queue": queue_over_time,
    "timeline": pass_timeline,
    "reuse": lost_kv_reuse,
    "load": node_load,
    "planner": planner_gains,
    "prefill_fit": prefill_fit,
    "decode_fit": decode_fit,
    "phi": phi_curve,
    "eviction": eviction_timeline,
    "counts": branch_counts_over_time,
    "count_tree": branch_count_tree,
}
TWIN_FIGURES: dict[str, Callable[..., go.Figure]] = {
    "twin_cdf": twin_cdf,
    "twin_scatter": twin_scatter,
}

__all__ = [
    "FIGURES",
    "TWIN_FIGURES",
    "branch_count_tree",
    "branch_counts_over_time",
    "decode_fit",
    "eviction_timeline",
    "is_empty",
    "latency_distributions",
    "lost_kv_reuse",
    "no_data",
    "node_load",
    "pass_timeline",
    "pd_split",
    "phi_curve",
    "planner_gains",
    "prefill_fit",
    "queue_over_time",
    "twin_cdf",
    "twin_scatter",
    "validation_series",
]
