"""Prometheus histograms and counters counted from the telemetry rows a cluster writes.

`RowMetrics` is a `TelemetrySink` the server taps into every `ClusterEngines`
(`set_telemetry_tap`): the rows the database stores (SPEC §3: `requests`,
`prefill_iterations`, `decode_iterations`, `phase_switches`, `evictions`) are
what it counts, so a scrape and a query of the run agree, for the paced simulator, torch
engines and SGLang alike, with or without a database. TTFT, TPOT, E2E, queue time and
forward-pass time are `prometheus_client` histograms (aggregatable across nodes and
servers, unlike the legacy rolling quantiles); tokens, requests, switches, evictions and
lost KV reuse are counters. The families and their meaning are `metric_catalog.ROW_METRICS`.
It names the tables it reads (`reads_tables`), so a simulator without a database builds no others:
not `kv_events` (a third of a simulation's time; the directory's event count is a gauge of
the scrape instead).

A simulator hands rows over in batches (every ~2 wall seconds, `cluster.sim.buffer`), live
collectors row by row: a scrape lags the cluster by at most one batch. `emit` may be called
from any of the engines' threads (prometheus_client's metrics lock themselves).
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import Counter, Histogram
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from cluster.core import PHASES, TIERS
from cluster.server.metric_catalog import ROW_METRICS, MetricSpec

UNKNOWN_NODE = "unknown"  # a row without its node (never for a finished simulated request)


def _family(spec: MetricSpec) -> Counter | Histogram:
    """The prometheus_client family of `spec`, in no registry (the app's registers it)."""
    if spec.kind == "histogram":
        return Histogram(
            spec.base_name, spec.help, spec.labels, registry=None, buckets=spec.buckets
        )
    return Counter(spec.base_name, spec.help, spec.labels, registry=None)


def _node(v: Any) -> str:
    return UNKNOWN_NODE if v is None else str(int(v))


class RowMetrics(Collector):
    """A telemetry sink that counts rows into Prometheus families (see module docstring)."""

    def __init__(self) -> None:
        self.families: dict[str, Counter | Histogram] = {s.name: _family(s) for s in ROW_METRICS}
        self._children: dict[tuple[str, tuple[str, ...]], Any] = {}
        self._handlers = {
            "requests": self._requests,
            "prefill_iterations": self._prefill_iterations,
            "decode_iterations": self._decode_iterations,
            "phase_switches": self._phase_switches,
            "evictions": self._evictions,
        }
        self.reads_tables = frozenset(self._handlers)  # a simulator builds no other

    # ---- TelemetrySink -------------------------------------------------------------------
    def emit(self, table: str, columns: Mapping[str, Sequence[Any]]) -> None:
        handler = self._handlers.get(table)
        if handler is not None:
            handler(columns)

    # ---- Collector -----------------------------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        for family in self.families.values():
            yield from family.collect()

    def describe(self) -> Iterator[Metric]:
        for family in self.families.values():
            yield from family.describe()

    def add_nodes(self, nodes: Iterable[int]) -> None:
        """Start every per-node series of `nodes` at zero, so `rate()` sees their first
        increments and a quiet node shows 0 rather than no data."""
        for n in map(str, nodes):
            for spec in ROW_METRICS:
                if spec.labels == ("node",):
                    self._child(spec.name, n)
            for phase in PHASES:
                self._child("pdlab_iteration_duration_seconds", n, phase)
            for tier in TIERS:
                self._child("pdlab_kv_evicted_blocks_total", n, tier)

    def _child(self, name: str, *labels: str) -> Any:
        key = (name, labels)
        child = self._children.get(key)
        if child is None:
            family = self.families[name]
            child = self._children[key] = family.labels(*labels) if labels else family
        return child

    def _add(self, name: str, amounts: Mapping[tuple[str, ...], float]) -> None:
        for labels, amount in amounts.items():
            if amount > 0:
                self._child(name, *labels).inc(amount)

    # ---- tables --------------------------------------------------------------------------
    def _requests(self, c: Mapping[str, Sequence[Any]]) -> None:
        n = len(c["t_arrival"])
        none: list[Any] = [None] * n

        def col(name: str) -> Sequence[Any]:
            return c.get(name) or none

        sums: dict[str, Tally[tuple[str, ...]]] = {
            k: Tally() for k in ("prompt", "generation", "hits", "fetched", "lost")
        }
        failed = 0
        e2e = self._child("pdlab_e2e_request_latency_seconds")
        rows = zip(
            c["t_arrival"], col("t_first_token"), col("t_done"), col("t_prefill_start"),
            col("prefill_node"), col("decode_node"), col("t_in"), col("t_c"), col("t_fetch"),
            col("t_out"), col("t_ideal_c"), strict=True,
        )  # fmt: skip
        for arrival, first, done, prefill_start, pn, dn, t_in, t_c, fetch, t_out, ideal in rows:
            if done is None:
                failed += 1
                continue
            p, d = (_node(pn),), (_node(dn),)
            first_s = (done if first is None else first) - arrival
            self._child("pdlab_time_to_first_token_seconds", *p).observe(first_s)
            e2e.observe(done - arrival)
            if prefill_start is not None:
                self._child("pdlab_request_queue_time_seconds", *p).observe(
                    max(prefill_start - arrival, 0.0)
                )
            if first is not None and t_out is not None and t_out >= 2:
                self._child("pdlab_request_time_per_output_token_seconds", *d).observe(
                    (done - first) / (t_out - 1)
                )
            sums["prompt"][p] += t_in or 0
            sums["generation"][d] += t_out or 0
            sums["hits"][p] += t_c or 0
            sums["fetched"][p] += fetch or 0
            if ideal is not None:
                sums["lost"][p] += max(ideal - (t_c or 0), 0)
        finished = n - failed
        if finished:
            self._child("pdlab_request_success_total").inc(finished)
        if failed:
            self._child("pdlab_request_failure_total").inc(failed)
        self._add("pdlab_prompt_tokens_total", sums["prompt"])
        self._add("pdlab_generation_tokens_total", sums["generation"])
        self._add("pdlab_prefix_cache_hits_total", sums["hits"])
        self._add("pdlab_kv_fetched_tokens_total", sums["fetched"])
        self._add("pdlab_kv_lost_reuse_tokens_total", sums["lost"])

    def _iterations(self, phase: str, c: Mapping[str, Sequence[Any]]) -> None:
        for node, duration in zip(c["node_id"], c["duration_s"], strict=True):
            self._child("pdlab_iteration_duration_seconds", _node(node), phase).observe(duration)

    def _prefill_iterations(self, c: Mapping[str, Sequence[Any]]) -> None:
        self._iterations("prefill", c)
        computed: Tally[tuple[str, ...]] = Tally()
        restored: Tally[tuple[str, ...]] = Tally()
        none = [0] * len(c["node_id"])
        rows = zip(c["node_id"], c.get("t_uc") or none, c.get("t_rst") or none, strict=True)
        for node, t_uc, t_rst in rows:
            computed[(_node(node),)] += t_uc or 0
            restored[(_node(node),)] += t_rst or 0
        self._add("pdlab_prefill_computed_tokens_total", computed)
        self._add("pdlab_prefill_restored_tokens_total", restored)

    def _decode_iterations(self, c: Mapping[str, Sequence[Any]]) -> None:
        self._iterations("decode", c)

    def _phase_switches(self, c: Mapping[str, Sequence[Any]]) -> None:
        n = len(c["node_id"])
        switches: Tally[tuple[str, ...]] = Tally()
        lost: Tally[tuple[str, ...]] = Tally()
        rows = zip(
            c["node_id"], c["from_phase"], c["to_phase"], c["trigger"],
            c.get("t_done") or [0.0] * n, c.get("lost_kv_blocks") or [None] * n, strict=True,
        )  # fmt: skip
        for node, from_phase, to_phase, trigger, done, lost_blocks in rows:
            if done is None:  # decided, not completed: counted when it completes
                continue
            switches[(_node(node), str(from_phase), str(to_phase), str(trigger))] += 1
            lost[(_node(node),)] += lost_blocks or 0
        self._add("pdlab_node_phase_switches_total", switches)
        self._add("pdlab_kv_lost_blocks_total", lost)

    def _evictions(self, c: Mapping[str, Sequence[Any]]) -> None:
        tally: Tally[tuple[str, ...]] = Tally(
            (_node(n), str(t)) for n, t in zip(c["node_id"], c["tier"], strict=True)
        )
        self._add("pdlab_kv_evicted_blocks_total", tally)
