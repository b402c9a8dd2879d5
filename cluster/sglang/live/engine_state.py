"""Per-engine state of a live SGLang cluster (SPEC §6).

`EngineState` is what the cluster tracks per engine beyond the control plane's view (health,
collectors, the last forward pass, switches, the online fit); `RestartAwareKVCollector`
notices an engine restart in its KV stream.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from cluster.sglang.live.cluster_file import EngineSpec
from cluster.sglang.live.role_switch import SwitchRecord
from cluster.sglang.wire.fpm_collector import ForwardMetricsCollector
from cluster.sglang.wire.kv_collector import KVEventCollector


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
    dead: bool = False  # its process exited (a launched engine): no more health checks
    fit: dict[str, Any] | None = None  # the last online refit (phases, samples, MAPE)
    # What the engine itself reports in /server_info (`kv_sync.KVSync`; None: not reported).
    kv_gpu_used_tokens: int | None = None
    kv_host_used_tokens: int | None = None
    kv_host_capacity_tokens: int = 0
    takes_branch_counts: bool = False  # serves /kv_eviction (branch-aware eviction)
    pushed_counts: dict[int, int] = dataclasses.field(default_factory=dict)  # R_b it holds

    def stream_stats(self) -> dict[str, Any]:
        """The counters of its KV-event and forward-pass streams (None: not collected)."""
        return {
            "kv": None if self.kv is None else self.kv.stats.as_dict(),
            "fpm": None if self.fpm is None else self.fpm.stats.as_dict(),
        }
