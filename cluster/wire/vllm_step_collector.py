"""vLLM engine steps (pdlab's stat-logger plugin) into DuckDB rows (SPEC §3; paper 000 §5.1).

`StepEmitter` turns `VLLMStep`s into `prefill_iterations`, `decode_iterations` and
`requests` rows (`vllm_step_rows.StepMapper`) and hands them to a telemetry sink, numbering
iterations per node; the plugin uses it directly when it writes a database itself.
`VLLMStepCollector` subscribes to the plugin's ZMQ publisher (`SequencedSubscriber`: gaps
replayed when the plugin serves a replay socket, restarts, reconnects) and feeds an emitter.

Counters: rows accepted per table, `num_rows_rejected` rows the sink refused (a one-line
warning each, no traceback), `mapper.untimed` steps with work but no duration.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from cluster.core import TelemetrySink
from cluster.wire.kv_events import WireError
from cluster.wire.subscriber import (
    DEFAULT_MAX_MESSAGE_BYTES,
    SequencedSubscriber,
    SubscribedCollector,
)
from cluster.wire.vllm_step_rows import StepMapper, StepRows
from cluster.wire.vllm_steps import STEPS_TOPIC, VLLMStep, decode_step

logger = logging.getLogger(__name__)

StepCallback = Callable[[int, VLLMStep, StepRows], None]  # (node, step, rows)


class StepEmitter:
    """Rows of vLLM steps into a sink (module docstring)."""

    def __init__(
        self,
        run_start_wall: float,
        sink: TelemetrySink | None = None,
        *,
        node_of: dict[int, int] | None = None,
        callbacks: Sequence[StepCallback] = (),
        request_prefix: str = "vllm",
    ) -> None:
        self.mapper = StepMapper(run_start_wall, node_of=node_of, request_prefix=request_prefix)
        self.sink = sink
        self.callbacks = list(callbacks)
        self.num_steps = 0
        self.num_rows: dict[str, int] = {
            "prefill_iterations": 0,
            "decode_iterations": 0,
            "requests": 0,
        }
        self.num_rows_rejected = 0
        self.handler_errors = 0
        self._next_iter: dict[int, int] = {}

    def on_step(self, step: VLLMStep) -> StepRows:
        self.num_steps += 1
        rows = self.mapper.rows(step)
        node = self.mapper.node(step.engine)
        if self.sink is not None:
            if rows.prefill is not None or rows.decode is not None:
                iter_id = self._next_iter.get(node, 0)
                self._next_iter[node] = iter_id + 1
                for table, row in (
                    ("prefill_iterations", rows.prefill),
                    ("decode_iterations", rows.decode),
                ):
                    if row is not None:
                        cols = {"node_id": [node], "iter_id": [iter_id]}
                        self._emit(table, cols | {k: [v] for k, v in row._asdict().items()}, 1)
            if rows.requests:
                cols = {
                    k: [r.columns()[k] for r in rows.requests] for k in rows.requests[0].columns()
                }
                self._emit("requests", cols, len(rows.requests))
        for cb in self.callbacks:
            try:
                cb(node, step, rows)
            except Exception:
                self.handler_errors += 1
                logger.exception("vLLM step callback %r failed", cb)
        return rows

    def _emit(self, table: str, columns: dict[str, list[Any]], n: int) -> None:
        assert self.sink is not None
        try:
            self.sink.emit(table, columns)
        except ValueError as e:  # the sink's validation (TelemetryError) refused the rows
            self.num_rows_rejected += n
            logger.warning("%s rows of a vLLM step rejected: %s", table, e)
        else:
            self.num_rows[table] += n


class VLLMStepCollector(SubscribedCollector):
    """Subscribe to one vLLM server's step stream (all its DP ranks) into an emitter."""

    def __init__(
        self,
        endpoint: str,
        emitter: StepEmitter,
        *,
        topic: str = STEPS_TOPIC,
        replay_endpoint: str | None = None,
        catch_up: bool = False,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        name: str = "pdlab-vllm-steps",
    ) -> None:
        self.emitter = emitter
        self._sub = SequencedSubscriber(
            endpoint,
            self._on_message,
            topic=topic,
            replay_endpoint=replay_endpoint,
            catch_up=catch_up,
            name=name,
            max_message_bytes=max_message_bytes,
        )

    def _on_message(self, seq: int, payload: bytes, recovered: bool) -> None:
        try:
            step = decode_step(payload)
        except WireError as e:
            self._sub._malformed(f"seq {seq}: {e}")
            return
        self.emitter.on_step(step)
