"""Policy sweeps on local processes or Ray (paper 003 §5.2).

A `SweepSpec` names a base configuration (SimConfig fields) and the axes to vary: a grid
(every combination) and/or random draws (seeded), each point replicated over `seeds`
(`spec`). Each point runs one simulation in a worker - a local `ProcessPoolExecutor` or a
Ray cluster (`backend="ray"`, the same function as a Ray task) - and becomes one row: the
point's parameters and the run's summary (`run`). Every point's configuration is checked
before the first one runs. Simulations are deterministic given their configuration, so
both backends give identical rows (wall time aside). Rows go into DuckDB's
`sweep_results` table and `aggregate` averages seeds into a summary table (`results`).

Named sweeps (paper 003's Table 1, every shipped policy, a smoke sweep) and the OpenEvolve
evaluator live with the other experiments in `cluster.experiments`.
"""

from cluster.sweep.results import (
    METRICS,
    SWEEP_TABLE,
    aggregate,
    read_results,
    write_results,
)
from cluster.sweep.run import BACKENDS, check_points, run_point, run_points, run_sweep
from cluster.sweep.spec import (
    SweepPoint,
    SweepSpec,
    default_warmup_s,
    expand,
    point_of,
    replay_end_s,
)

__all__ = [
    "BACKENDS",
    "METRICS",
    "SWEEP_TABLE",
    "SweepPoint",
    "SweepSpec",
    "aggregate",
    "check_points",
    "default_warmup_s",
    "expand",
    "point_of",
    "read_results",
    "replay_end_s",
    "run_point",
    "run_points",
    "run_sweep",
    "write_results",
]
