"""Prometheus exposition of a live cluster (SPEC §6 `GET /metrics`).

One `CollectorRegistry` per app (no global state, so several servers can live in one
process, as in tests). The collector reads one consistent snapshot of the cluster under the
control-plane lock at scrape time: the PD split (paper 000 Fig. 1), per-node health, queue,
running requests and KV in GPU and host memory (not for a node whose engine is down: those
values would be stale), rolling TTFT / E2E, and counters of completed requests and phase
switches.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from cluster.server.service import ControlService

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class LiveCollector(Collector):
    def __init__(self, service: ControlService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        snap = self.service.metrics_snapshot()
        if snap is None:
            return
        yield GaugeMetricFamily("pdlab_sim_time_seconds", "Simulated time of the run", snap["time"])
        split = GaugeMetricFamily("pdlab_split_nodes", "Nodes serving each phase", labels=["phase"])
        for phase in ("prefill", "decode"):
            split.add_metric([phase], snap["split"][phase])
        yield split
        per_node = {
            "queue": ("pdlab_node_queue_requests", "Requests queued for prefill on the node"),
            "running": ("pdlab_node_running_requests", "Requests in the node's running batch"),
            "kv_gpu_used": ("pdlab_node_kv_gpu_used_tokens", "KV tokens held in GPU memory"),
            "kv_host_used": ("pdlab_node_kv_host_used_tokens", "KV tokens held in host memory"),
        }
        # A node whose engine is down reports no queue or KV: its last values are stale.
        healthy = {n["id"]: n.get("healthy") is not False for n in snap["nodes"]}
        up = GaugeMetricFamily(
            "pdlab_node_healthy", "1 while the node's engine is up, 0 when it is down",
            labels=["node"],
        )  # fmt: skip
        for n in snap["nodes"]:
            up.add_metric([str(n["id"])], 1.0 if healthy[n["id"]] else 0.0)
        yield up
        for key, (name, doc) in per_node.items():
            g = GaugeMetricFamily(name, doc, labels=["node"])
            for n in snap["nodes"]:
                if healthy[n["id"]]:
                    g.add_metric([str(n["id"])], n[key])
            yield g
        phases = GaugeMetricFamily(
            "pdlab_node_phase", "1 for the phase a node serves", labels=["node", "phase"]
        )
        switching = GaugeMetricFamily(
            "pdlab_node_switching", "1 while the node drains for a switch", labels=["node"]
        )
        for n in snap["nodes"]:
            for p in ("prefill", "decode"):
                phases.add_metric([str(n["id"]), p], 1.0 if n["phase"] == p else 0.0)
            switching.add_metric([str(n["id"])], 0.0 if n["switching"] is None else 1.0)
        yield phases
        yield switching
        lat = snap["latency"]
        q = GaugeMetricFamily(
            "pdlab_latency_seconds",
            f"Rolling latency quantiles over the last {lat['window_s']:g} simulated seconds",
            labels=["metric", "quantile"],
        )
        for metric in ("ttft", "e2e"):
            for quant, key in (("0.5", "p50"), ("0.95", "p95")):
                v = lat[f"{metric}_{key}_s"]
                if v is not None:
                    q.add_metric([metric, quant], v)
        yield q
        yield CounterMetricFamily(
            "pdlab_requests_completed", "Requests completed", snap["requests_completed"]
        )
        yield CounterMetricFamily(
            "pdlab_phase_switches", "Completed phase switches", snap["switches"]
        )
        yield GaugeMetricFamily(
            "pdlab_directory_blocks", "Blocks in the KV directory", snap["directory"]["blocks"]
        )


def make_registry(service: ControlService) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LiveCollector(service))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
