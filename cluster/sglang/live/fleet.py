"""The engines of a live SGLang cluster: their state, collectors and health (SPEC §6).

`EngineFleet` holds one `EngineState` per engine and runs, per engine, a KV event collector
(its events build the KV directory, its rows go to `kv_events`) and a forward-pass-metrics
collector (iteration rows for `pdlab fit`, the last pass for the node reports of paper 000
App. E.3), resubscribes them when a relaunched engine moved its endpoints, and polls the
engines' /health. It signals upward through the callbacks the cluster wires in (KV events,
a publisher restart, a forward pass); every callback runs with the cluster's lock held.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import httpx

from cluster.control.lock import ContendedRLock
from cluster.core import KVEvent, TelemetrySink
from cluster.sglang.live.cluster_file import EngineSpec
from cluster.sglang.live.engine_state import EngineState, RestartAwareKVCollector
from cluster.sglang.live.outages import Outages
from cluster.sglang.wire.fpm import DecodeRow, ForwardPassMetrics, PrefillRow
from cluster.sglang.wire.fpm_collector import ForwardMetricsCollector

log = logging.getLogger(__name__)

OnPass = Callable[[int, float, PrefillRow | None, DecodeRow | None], None]
FRESH_PASS_S = 1.0  # a forward pass older than this says nothing about what runs now


class EngineFleet:
    """See module docstring."""

    def __init__(
        self,
        specs: Iterable[EngineSpec],
        lock: ContendedRLock,
        clock: Callable[[], float],
        *,
        sink: TelemetrySink | None,
        run_start_wall: float,
        catch_up: bool,
        on_kv_events: Callable[[list[KVEvent]], None],
        on_restart: Callable[[int], int],
        on_pass: OnPass,
    ) -> None:
        self.states = {e.node_id: EngineState(e) for e in specs}
        self.outages = Outages(sink)  # engines out of service, for the run's end
        self.lock = lock
        self.clock = clock
        self.sink = sink
        self.run_start_wall = run_start_wall
        self.catch_up = catch_up
        self.on_kv_events = on_kv_events
        self.on_restart = on_restart  # returns the blocks dropped from the directory
        self.on_pass = on_pass
        self._tok_i = 0

    # ---- lookups (lock held) --------------------------------------------------------------
    def engine(self, node: int) -> EngineSpec:
        return self.states[node].spec

    def tokenizer_url(self) -> str | None:
        """A healthy engine to tokenize with (rotating, so no engine takes all of it)."""
        ups = [e.spec.http_url for _, e in sorted(self.states.items()) if e.up]
        if not ups:
            return None
        self._tok_i += 1
        return ups[self._tok_i % len(ups)]

    def running(self, node: int) -> int:
        """Requests in the engine's last forward pass, if it is fresh (an idle engine sends
        heartbeats, which carry no requests)."""
        st = self.states[node]
        fresh = st.fpm_t is not None and self.clock() - st.fpm_t < FRESH_PASS_S
        return st.running if fresh else 0

    def num_up(self) -> int:
        return sum(1 for e in self.states.values() if e.up)

    # ---- collectors -------------------------------------------------------------------------
    def start_collectors(self, node: int) -> None:
        st = self.states[node]
        spec = st.spec
        if spec.kv_events:
            st.kv = RestartAwareKVCollector(
                spec.kv_events,
                on_restart=self._publisher_restarted,
                node_id=node,
                topic=spec.kv_topic,
                replay_endpoint=spec.kv_replay,
                callbacks=[self._kv_events],
                sink=self.sink,
                run_start_wall=self.run_start_wall,
                catch_up=self.catch_up,
            ).start()
        else:
            log.warning(
                "engine %d (%s) publishes no KV events (start SGLang with --kv-events-config):"
                " the router sees no prefix on it",
                node,
                spec.http_url,
            )
        if spec.forward_metrics:
            st.fpm = ForwardMetricsCollector(
                spec.forward_metrics,
                node_id=node,
                sink=self.sink,
                callbacks=[self._pass_callback(node)],
                run_start_wall=self.run_start_wall,
                chunk_tokens=spec.chunk_tokens,
            ).start()
        else:
            log.warning(
                "engine %d (%s) publishes no forward-pass metrics (start SGLang with "
                "--enable-forward-pass-metrics): no iteration rows to fit",
                node,
                spec.http_url,
            )

    def stop_collectors(self, node: int) -> None:
        st = self.states[node]
        for col in (st.kv, st.fpm):
            if col is not None:
                col.stop()  # idempotent; its stats stay readable

    def close(self) -> None:
        for n in list(self.states):
            self.stop_collectors(n)

    def restart_collectors(self, node: int, spec: EngineSpec) -> None:
        """New endpoints of a relaunched engine: resubscribe (rows already received stay)."""
        self.stop_collectors(node)
        with self.lock:
            self.states[node].spec = spec
        self.start_collectors(node)

    def _kv_events(self, events: list[KVEvent]) -> None:
        with self.lock:
            self.on_kv_events(events)

    def _publisher_restarted(self, node: int, last: int, seq: int) -> None:
        with self.lock:
            held = self.on_restart(node)
            self.states[node].restarts_seen += 1
        log.warning(
            "engine %d's KV publisher restarted (seq %d after %d): the engine's cache is "
            "empty, %d stale blocks dropped from the directory",
            node,
            seq,
            last,
            held,
        )

    def _pass_callback(self, node: int) -> Any:
        def on_metrics(
            m: ForwardPassMetrics, prefill: PrefillRow | None, decode: DecodeRow | None
        ) -> None:
            s = m.scheduled_requests
            with self.lock:
                st = self.states[node]
                now = self.clock()
                st.fpm_t = now
                st.running = s.num_prefill_requests + s.num_decode_requests
                if prefill is not None:
                    st.prefill_iterations += 1
                if decode is not None:
                    st.decode_iterations += 1
                    st.decode_kv_tokens = decode.ctx_tokens
                self.on_pass(node, now, prefill, decode)

        return on_metrics

    # ---- health -----------------------------------------------------------------------------
    def check_health(
        self,
        client: httpx.Client,
        headers: dict[str, str],
        failures_to_down: int,
        on_healthy: Callable[[int], None],
        on_failing: Callable[[int, str], None],
    ) -> None:
        """GET /health of every engine not relaunching, outside the lock; an engine is
        failing once `failures_to_down` checks in a row failed."""
        for n, st in list(self.states.items()):
            if st.relaunching or st.dead:
                continue
            try:
                r = client.get(f"{st.spec.http_url}/health", headers=headers)
                ok, why = r.status_code == 200, f"/health answered {r.status_code}"
            except httpx.HTTPError as e:
                ok, why = False, f"/health failed: {type(e).__name__}: {e}"
            if ok:
                on_healthy(n)
                continue
            with self.lock:
                st.failures += 1
                st.last_error = why
                failing = st.failures >= failures_to_down
            if failing:
                on_failing(n, why)

    def mark_down(self, node: int, reason: str) -> bool:
        """Record `reason`; True when the engine was up until now (an outage begins)."""
        st = self.states[node]
        st.last_error = reason
        if not st.up:
            return False
        st.up = False
        self.outages.down(node, st.spec.http_url, self.clock(), reason)
        return True

    def mark_up(self, node: int) -> bool:
        """A healthy check; True when the engine was down until now (its outage ends)."""
        st = self.states[node]
        st.failures = 0
        if st.up:
            return False
        st.up = True
        self.outages.up(node, self.clock())
        return True

    def mark_dead(self, node: int, reason: str) -> None:
        """`node`'s process exited (after `mark_down`): no more health checks, its counts
        zero, its KV gone (a `cleared` row per tier)."""
        st = self.states[node]
        st.dead, st.last_error = True, reason
        st.kv_gpu_used_tokens = st.kv_host_used_tokens = None  # stale from now on
        st.decode_kv_tokens = st.running = 0
        self.outages.died(node, st.spec.http_url, self.clock(), reason)

    def status_extras(self, node: int) -> dict[str, Any]:
        """The engine-specific fields of the node's status (GET /v1/cluster)."""
        st = self.states[node]
        return {
            "url": st.spec.http_url,
            "healthy": st.up,
            "last_error": st.last_error,
            "kv_stream": None if st.kv is None else st.kv.stats.as_dict(),
            "fpm_stream": None if st.fpm is None else st.fpm.stats.as_dict(),
            "publisher_restarts": st.restarts_seen,
            "last_switch": None if st.last_switch is None else st.last_switch.as_dict(),
        }
