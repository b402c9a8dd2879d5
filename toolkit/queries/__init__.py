"""The data behind the figures: DuckDB queries over pdlab telemetry, without plotly.

Every query function takes a `Run` (one reader connection with the run resolved, from
`open_run(db_or_reader, run_id)`) and returns a NamedTuple of polars frames and plain
values; the figure library `toolkit.plots` draws them. A `missing` field says why there is
nothing to draw (None otherwise). One module per figure family:

- `run`: `Run`, `open_run`, hash sampling, round time bins, phase-switch times;
- `split` (`split_data`, `phase_segments`), `latency` (`latency_data`), `reuse`
  (`reuse_data`, `reuse_totals`), `load` (`load_data`), `planner` (`planner_data`),
  `fits` (`fit_data`, `decode_noise`), `phi` (`phi_data`), `eviction` (`eviction_data`), `branches`
  (`counts_data`, `count_tree_data`).
"""

from toolkit.queries.branches import CountsData, TreeData, count_tree_data, counts_data
from toolkit.queries.eviction import EvictionData, eviction_data
from toolkit.queries.fits import FitData, decode_noise, fit_data
from toolkit.queries.latency import LatencyData, latency_data
from toolkit.queries.load import LoadData, load_data
from toolkit.queries.phi import PhiData, phi_data
from toolkit.queries.planner import PlannerData, gain_threshold, planner_data
from toolkit.queries.reuse import ReuseData, reuse_data, reuse_totals
from toolkit.queries.run import Run, Source, open_run
from toolkit.queries.split import SplitData, Timeline, phase_segments, split_data

__all__ = [
    "CountsData",
    "EvictionData",
    "FitData",
    "LatencyData",
    "LoadData",
    "PhiData",
    "PlannerData",
    "ReuseData",
    "Run",
    "Source",
    "SplitData",
    "Timeline",
    "TreeData",
    "count_tree_data",
    "counts_data",
    "decode_noise",
    "eviction_data",
    "fit_data",
    "gain_threshold",
    "latency_data",
    "load_data",
    "open_run",
    "phase_segments",
    "phi_data",
    "planner_data",
    "reuse_data",
    "reuse_totals",
    "split_data",
]
