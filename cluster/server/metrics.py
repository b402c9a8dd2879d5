"""Prometheus exposition of a live cluster (SPEC §6 `GET /metrics`; reference docs/metrics.md).

One `CollectorRegistry` per app (no global state, so several servers can live in one
process, as in tests) holds two collectors: the service's `RowMetrics` (histograms and
counters counted from the telemetry rows, row_metrics.py) and `LiveCollector`, which reads
one consistent snapshot of the cluster under the control-plane lock at scrape time: the PD
split (paper 000 Fig. 1), per node its health, phase, running and waiting requests and KV use
and capacity per tier (not for a node whose engine is down: those values would be stale), the branch table and KV directory, and the planner's last gain test
(Eq. 6). Every family is declared once in `metric_catalog.py`; a gauge of a node is one
entry of `NODE_GAUGES` below.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cluster.core import PHASES, TIERS
from cluster.server.metric_catalog import BY_NAME

if TYPE_CHECKING:
    from cluster.server.service import ControlService

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Gauges with one sample per node: name -> the value from the node's /v1/cluster entry.
NODE_GAUGES: dict[str, Callable[[dict[str, Any]], float]] = {
    "pdlab_num_requests_running": lambda n: n["running"],
    "pdlab_num_requests_waiting": lambda n: n["queue"],
    "pdlab_num_requests_waiting_kv": lambda n: n["waiting_kv"],
    "pdlab_node_switching": lambda n: 0.0 if n["switching"] is None else 1.0,
    "pdlab_node_directory_blocks": lambda n: n["directory_blocks"],
    "pdlab_node_queue_requests": lambda n: n["queue"],
    "pdlab_node_running_requests": lambda n: n["running"],
    "pdlab_node_kv_gpu_used_tokens": lambda n: n["kv_gpu_used"],
    "pdlab_node_kv_host_used_tokens": lambda n: n["kv_host_used"],
}
# Gauges of the whole cluster: name -> the value from the snapshot (None: no sample).
CLUSTER_GAUGES: dict[str, Callable[[dict[str, Any]], float | None]] = {
    "pdlab_sim_time_seconds": lambda s: s["time"],
    "pdlab_requests_in_flight": lambda s: s["latency"]["in_flight"],
    "pdlab_branches_active": lambda s: s["branches_active"],
    "pdlab_directory_blocks": lambda s: s["directory"]["blocks"],
    "pdlab_directory_holdings": lambda s: s["directory"]["holdings"],
    "pdlab_directory_counted_holdings": lambda s: s["directory"]["counted_holdings"],
    "pdlab_planner_last_evaluation_time_seconds": lambda s: _decision(s, "t"),
    "pdlab_planner_recommended_prefill_nodes": lambda s: _decision(s, "chosen_prefill"),
}
CLUSTER_COUNTERS: dict[str, Callable[[dict[str, Any]], float]] = {
    "pdlab_directory_events_total": lambda s: s["directory"]["events"],
    "pdlab_requests_completed_total": lambda s: s["requests_completed"],
    "pdlab_phase_switches_total": lambda s: s["switches"],
}
# Per candidate split of the planner's last evaluation: name -> the candidate's field.
PLANNER_GAUGES = {
    "pdlab_planner_gain_requests_per_second": "mean_gain",
    "pdlab_planner_gain_std_requests_per_second": "std_gain",
    "pdlab_planner_candidate_qualified": "qualified",
}


def _decision(snap: dict[str, Any], key: str) -> float | None:
    d = snap["planner_decision"]
    return None if d is None else d[key]


def _gauge(name: str) -> GaugeMetricFamily:
    spec = BY_NAME[name]
    return GaugeMetricFamily(name, spec.help, labels=spec.labels)


class LiveCollector(Collector):
    """The cluster's state at scrape time (see module docstring)."""

    def __init__(self, service: ControlService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        snap = self.service.metrics_snapshot()
        if snap is None:
            return
        nodes = snap["nodes"]
        for name, value in CLUSTER_GAUGES.items():
            g = _gauge(name)
            v = value(snap)
            if v is not None:
                g.add_metric([], float(v))
            yield g
        for name, count in CLUSTER_COUNTERS.items():
            spec = BY_NAME[name]
            yield CounterMetricFamily(spec.base_name, spec.help, value=float(count(snap)))
        split = _gauge("pdlab_split_nodes")
        for phase in PHASES:
            split.add_metric([phase], snap["split"][phase])
        yield split
        # A node whose engine is down reports no queue or KV: its last values are stale.
        up = _gauge("pdlab_node_healthy")
        for n in nodes:
            up.add_metric([str(n["id"])], 0.0 if n.get("healthy") is False else 1.0)
        yield up
        live = [n for n in nodes if n.get("healthy") is not False]
        for name, value in NODE_GAUGES.items():
            g = _gauge(name)
            for n in live:
                g.add_metric([str(n["id"])], float(value(n)))
            yield g
        yield from self._phases(nodes)
        yield from self._kv(live)
        yield from self._planner(snap["planner_decision"])
        yield self._latency(snap["latency"])

    def _phases(self, nodes: list[dict[str, Any]]) -> Iterator[Metric]:
        g = _gauge("pdlab_node_phase")
        for n in nodes:
            for p in PHASES:
                g.add_metric([str(n["id"]), p], 1.0 if n["phase"] == p else 0.0)
        yield g

    def _kv(self, nodes: list[dict[str, Any]]) -> Iterator[Metric]:
        used = _gauge("pdlab_kv_cache_used_tokens")
        capacity = _gauge("pdlab_kv_cache_capacity_tokens")
        usage = _gauge("pdlab_kv_cache_usage_perc")
        for n in nodes:
            for tier in TIERS:
                labels = [str(n["id"]), tier]
                u, c = n[f"kv_{tier}_used"], n[f"kv_{tier}_capacity"]
                used.add_metric(labels, u)
                capacity.add_metric(labels, c)
                if c > 0:
                    usage.add_metric(labels, u / c)
        yield from (used, capacity, usage)

    def _planner(self, decision: dict[str, Any] | None) -> Iterator[Metric]:
        for name, field in PLANNER_GAUGES.items():
            g = _gauge(name)
            for c in decision["candidates"] if decision is not None else ():
                if c[field] is not None:
                    g.add_metric([str(c["prefill_count"])], float(c[field]))
            yield g

    def _latency(self, lat: dict[str, Any]) -> Metric:
        g = _gauge("pdlab_latency_seconds")
        for metric in ("ttft", "e2e"):
            for quant, key in (("0.5", "p50"), ("0.95", "p95")):
                v = lat[f"{metric}_{key}_s"]
                if v is not None:
                    g.add_metric([metric, quant], v)
        return g


def make_registry(service: ControlService) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(service.row_metrics)
    registry.register(LiveCollector(service))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
