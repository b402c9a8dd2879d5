"""Per-engine state of a live SGLang cluster and its small helpers (SPEC §6).

`EngineState` is what `SGLangCluster` tracks per engine beyond the control plane's view;
`LockedSink` funnels many threads' telemetry into one writer; `RestartAwareKVCollector`
notices an engine restart in its KV stream; `RollingLatency` gives the dashboard's TTFT/E2E.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from cluster.sglang.cluster_file import EngineSpec
from cluster.sglang.forward_metrics import ForwardMetricsCollector
from cluster.sglang.kv_collector import KVEventCollector
from cluster.sglang.proxy import LiveRequest
from cluster.sglang.role_switch import SwitchRecord

log = logging.getLogger(__name__)


class LockedSink:
    """Serializes emits of many threads into one (not thread-safe) telemetry writer.

    A rejected batch is logged with the writer's message and counted (`errors`); it never
    fails a client request or stops a collector. Rows already accepted stay accepted.
    """

    def __init__(self, writer: Any) -> None:
        self.writer = writer
        self.lock = threading.Lock()
        self.errors = 0
        self.last_error: str | None = None

    def emit(self, table: str, columns: Mapping[str, Sequence[Any]]) -> None:
        with self.lock:
            try:
                self.writer.emit(table, columns)
            except Exception as e:
                self.errors += 1
                self.last_error = f"{table}: {e}"
                log.error("telemetry batch for %s rejected: %s", table, e)

    def flush(self) -> None:
        with self.lock:
            self.writer.flush()

    def close(self) -> None:
        with self.lock:
            self.writer.close()


class RestartAwareKVCollector(KVEventCollector):
    """A KV collector that tells its cluster when the engine's publisher restarted.

    SGLang numbers batches from 0 when the scheduler starts, and a restarted engine starts
    with an empty cache without publishing AllBlocksCleared: the node's directory entries
    are stale from that moment. The first message of a new epoch (seq <= last, including
    the new epoch's head recovered by replay) clears them before its events apply.
    """

    def __init__(
        self, endpoint: str, *, on_restart: Callable[[int, int, int], None], **kw: Any
    ) -> None:
        super().__init__(endpoint, **kw)
        self._on_restart = on_restart
        self._last: int | None = None

    def _on_message(self, seq: int, payload: bytes, recovered: bool) -> None:
        if self._last is not None and seq <= self._last:
            self._on_restart(self.node_id, self._last, seq)
        self._last = seq
        super()._on_message(seq, payload, recovered)


@dataclasses.dataclass(slots=True)
class EngineState:
    """What the cluster tracks per engine besides the control plane's view."""

    spec: EngineSpec
    up: bool = True
    failures: int = 0
    last_error: str | None = None
    kv: KVEventCollector | None = None
    fpm: ForwardMetricsCollector | None = None
    fpm_t: float | None = None
    running: int = 0  # requests in the engine's last forward pass
    decode_kv_tokens: int = 0
    prefill_iterations: int = 0
    decode_iterations: int = 0
    restarts_seen: int = 0
    last_switch: SwitchRecord | None = None
    relaunching: bool = False
    fit: dict[str, Any] | None = None  # the last online refit (phases, samples, MAPE)


class RollingLatency:
    """Rolling TTFT / E2E of the requests finished in the last `window_s` seconds."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.done: deque[tuple[float, float, float]] = deque()
        self.completed = 0

    def add(self, rec: LiveRequest) -> None:
        if rec.t_done is None:
            return
        first = rec.t_first_token if rec.t_first_token is not None else rec.t_done
        self.done.append((rec.t_done, first - rec.t_arrival, rec.t_done - rec.t_arrival))
        self.completed += 1

    def stats(self, now: float, in_flight: int) -> dict[str, Any]:
        while self.done and self.done[0][0] < now - self.window_s:
            self.done.popleft()
        rows = np.array(self.done, dtype=np.float64).reshape(-1, 3)
        span = min(self.window_s, now) if now > 0 else self.window_s
        out: dict[str, Any] = {
            "window_s": self.window_s,
            "requests": int(rows.shape[0]),
            "in_flight": in_flight,
            "throughput_rps": rows.shape[0] / span if span > 0 else None,
        }
        for name, col in (("ttft", 1), ("e2e", 2)):
            v = rows[:, col]
            for key, q in (("p50", 50), ("p95", 95)):
                out[f"{name}_{key}_s"] = float(np.percentile(v, q)) if v.size else None
            out[f"{name}_mean_s"] = float(v.mean()) if v.size else None
        return out
