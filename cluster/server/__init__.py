"""The live control server of SPEC §6: a simulated cluster paced to wall-clock time behind REST.

`LiveCluster` (live.py) runs the simulator of SPEC §5 in a background thread at `speed`
simulated seconds per wall second and writes its telemetry while it runs; `create_app`
(app.py) exposes the control plane (paper 000 §4.3, App. E: phase switches, planner, router,
branch table, KV directory) over FastAPI; `metrics.py` serves Prometheus gauges and counters.
"""

from cluster.server.app import create_app
from cluster.server.errors import ApiError, ConflictError, InvalidRequestError, NotFoundError
from cluster.server.live import LiveCluster, LiveConfig

__all__ = [
    "ApiError",
    "ConflictError",
    "InvalidRequestError",
    "LiveCluster",
    "LiveConfig",
    "NotFoundError",
    "create_app",
]
