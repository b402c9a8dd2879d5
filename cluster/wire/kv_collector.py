"""Collect one engine's KV events (SGLang / vLLM ZMQ publisher) into the directory and DuckDB.

SPEC §4 (KV directory fed by stored/removed/cleared events, as in Dynamo's KV indexer) and
§3 (`kv_events` table). A `KVEventCollector` subscribes to an engine's publisher
(`SequencedSubscriber`: gap replay, restarts, reconnects), decodes each batch leniently
(`wire.BatchDecoder`) and hands the `KVEvent`s to callbacks (the directory) and their rows
to a telemetry sink. Times are seconds since `run_start_wall` (the run's `started_at`).

Counters: `num_events` decoded, `num_skipped` events dropped by the decoder (malformed or
untiered; the batch's good events are kept), `num_rows` rows the sink accepted and
`num_rows_rejected` rows it refused (a one-line warning each time, no traceback).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from cluster.core import KVEvent, TelemetrySink
from cluster.wire.kv_events import BatchDecoder, WireError, kv_event_rows
from cluster.wire.subscriber import (
    DEFAULT_MAX_MESSAGE_BYTES,
    SequencedSubscriber,
    SubscribedCollector,
)

logger = logging.getLogger(__name__)

KVEventCallback = Callable[[list[KVEvent]], None]


class KVEventCollector(SubscribedCollector):
    """Subscribe to one node's KV event stream; see the module docstring.

    `callbacks` get each batch's events in publish order (replayed batches are delivered in
    order before the live batch that revealed the gap). A callback that raises is logged
    and counted in `stats.handler_errors`; the stream goes on.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        node_id: int = 0,
        topic: str = "",
        replay_endpoint: str | None = None,
        callbacks: Sequence[KVEventCallback] = (),
        sink: TelemetrySink | None = None,
        run_start_wall: float | None = None,
        catch_up: bool = False,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        if node_id < 0:
            raise ValueError(f"node_id must be >= 0, got {node_id}")
        self.node_id = node_id
        self.callbacks = list(callbacks)
        self.sink = sink
        self.run_start_wall = time.time() if run_start_wall is None else run_start_wall
        self.decoder = BatchDecoder(node_id, self.run_start_wall)
        self.num_events = 0
        self.num_rows = 0
        self.num_rows_rejected = 0
        self.num_skipped = 0
        self._sub = SequencedSubscriber(
            endpoint,
            self._on_message,
            topic=topic,
            replay_endpoint=replay_endpoint,
            catch_up=catch_up,
            name=f"pdlab-kv-{node_id}",
            max_message_bytes=max_message_bytes,
        )

    def _on_message(self, seq: int, payload: bytes, recovered: bool) -> None:
        try:
            batch = self.decoder.decode(payload)
        except WireError as e:
            self._sub._malformed(f"seq {seq}: {e}")
            return
        self.num_skipped += batch.skipped
        if not batch.events:
            return
        self.num_events += len(batch.events)
        if self.sink is not None:
            rows = kv_event_rows(batch.events)
            try:
                self.sink.emit("kv_events", rows)
            except ValueError as e:  # the sink's validation (TelemetryError) refused the rows
                self.num_rows_rejected += len(rows["t"])
                logger.warning("kv_events rows of seq %d rejected: %s", seq, e)
            else:
                self.num_rows += len(rows["t"])
        for cb in self.callbacks:
            try:
                cb(batch.events)
            except Exception:
                # One consumer's bug must not starve the others or stop the stream.
                self._sub.stats.handler_errors += 1
                logger.exception("KV event callback %r failed", cb)
