"""The live control server of SPEC §6, for any cluster of engines.

`ControlService` (service.py) answers the REST API over a `ClusterEngines` implementation
(`cluster.control.engines`: the simulator paced to wall-clock time, live SGLang engines...)
and owns the rolling latency and timeline (latency.py); payloads.py writes each JSON shape
once; `create_app` (app.py) exposes it over FastAPI (paper 000 §4.3, App. E: phase switches,
planner, router, branch table, KV directory); metrics.py serves Prometheus gauges and
counters. The server imports no engine: `pdlab serve` wires one in.
"""

from cluster.server.app import create_app
from cluster.server.errors import ApiError, ConflictError, InvalidRequestError, NotFoundError
from cluster.server.service import ControlService, ServiceConfig

__all__ = [
    "ApiError",
    "ConflictError",
    "ControlService",
    "InvalidRequestError",
    "NotFoundError",
    "ServiceConfig",
    "create_app",
]
