"""Collect SGLang forward-pass metrics into `prefill_iterations` / `decode_iterations` (SPEC §3).

Paper 000 §5.1 fits Eq. 1 and Eq. 2 per node on logged iterations; with a live SGLang engine
those iterations come from `--enable-forward-pass-metrics` (wire and row mapping in
`cluster.sglang.fpm`). The FPM publisher has no replay socket, so a gap is counted as lost
iterations (the fit only needs a sample, not every pass). Heartbeats are skipped.

Counters: `num_prefill_rows` / `num_decode_rows` rows the sink accepted,
`num_rows_rejected` rows it refused (a one-line warning each time, no traceback); a payload
that is not a valid metrics message (`fpm.decode_fpm`) counts as malformed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from cluster.core import TelemetrySink
from cluster.sglang.fpm import (
    DecodeRow,
    ForwardPassMetrics,
    PrefillRow,
    decode_fpm,
    iteration_rows,
)
from cluster.wire.kv_events import WireError
from cluster.wire.subscriber import (
    DEFAULT_MAX_MESSAGE_BYTES,
    SequencedSubscriber,
    SubscribedCollector,
)

logger = logging.getLogger(__name__)

MetricsCallback = Callable[[ForwardPassMetrics, PrefillRow | None, DecodeRow | None], None]


class ForwardMetricsCollector(SubscribedCollector):
    """Subscribe to one node's FPM stream and emit one iteration row per forward pass.

    `chunk_tokens` (the engine's chunked_prefill_size, /server_info) sharpens the ΣA
    estimate of chunk-limited passes (`iteration_rows.estimate_attn_pairs`).
    """

    def __init__(
        self,
        endpoint: str,
        *,
        node_id: int = 0,
        sink: TelemetrySink | None = None,
        callbacks: Sequence[MetricsCallback] = (),
        run_start_wall: float | None = None,
        chunk_tokens: int | None = None,
        clock: Callable[[], float] = time.time,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        if node_id < 0:
            raise ValueError(f"node_id must be >= 0, got {node_id}")
        self.node_id = node_id
        self.sink = sink
        self.callbacks = list(callbacks)
        self.run_start_wall = clock() if run_start_wall is None else run_start_wall
        self._clock = clock
        self.chunk_tokens = chunk_tokens  # the engine's chunked_prefill_size, if known
        self.num_prefill_rows = 0
        self.num_decode_rows = 0
        self.num_heartbeats = 0
        self.num_rows_rejected = 0
        self._next_iter = 0
        self._sub = SequencedSubscriber(
            endpoint,
            self._on_message,
            name=f"pdlab-fpm-{node_id}",
            max_message_bytes=max_message_bytes,
        )

    def _emit(self, seq: int, table: str, iter_id: int, row: PrefillRow | DecodeRow) -> bool:
        """Hand one row to the sink; False (counted, warned) if the sink refused it."""
        assert self.sink is not None
        columns = {"node_id": [self.node_id], "iter_id": [iter_id]}
        try:
            self.sink.emit(table, columns | {k: [v] for k, v in row._asdict().items()})
        except ValueError as e:  # the sink's validation (TelemetryError) refused the row
            self.num_rows_rejected += 1
            logger.warning("%s row of seq %d rejected: %s", table, seq, e)
            return False
        return True

    def _on_message(self, seq: int, payload: bytes, recovered: bool) -> None:
        t_end = self._clock() - self.run_start_wall
        try:
            m = decode_fpm(payload)
        except WireError as e:
            self._sub._malformed(f"seq {seq}: {e}")
            return
        if m.is_heartbeat:
            self.num_heartbeats += 1
            return
        prefill, decode = iteration_rows(m, t_end, self.chunk_tokens)
        iter_id = self._next_iter
        self._next_iter += 1
        if (
            self.sink is not None
            and prefill is not None
            and self._emit(seq, "prefill_iterations", iter_id, prefill)
        ):
            self.num_prefill_rows += 1
        if (
            self.sink is not None
            and decode is not None
            and self._emit(seq, "decode_iterations", iter_id, decode)
        ):
            self.num_decode_rows += 1
        for cb in self.callbacks:
            try:
                cb(m, prefill, decode)
            except Exception:
                self._sub.stats.handler_errors += 1
                logger.exception("forward-metrics callback %r failed", cb)
