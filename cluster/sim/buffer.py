"""Columnar buffering of telemetry rows between the simulator and a sink.

The simulator emits one row at a time from hot paths; `BufferedSink` appends to per-table
column lists and hands the sink large batches, so the writer sees few, big Arrow batches.
A table is handed over when it holds `batch_rows` rows, and every table at least every
`flush_interval_s` wall seconds, so a simulation killed mid-run has handed over all but its
last few seconds of rows (the writer flushes on the same time bound into live segments).
The clock is read once per `_CLOCK_EVERY` rows, which keeps the hot path to a counter.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from cluster.core import TelemetrySink

_CLOCK_EVERY = 64


class BufferedSink:
    def __init__(
        self,
        sink: TelemetrySink,
        batch_rows: int = 50_000,
        skip: frozenset[str] = frozenset(),
        flush_interval_s: float = 2.0,
    ) -> None:
        self.sink = sink
        self.batch_rows = batch_rows
        self.skip = skip
        # A sink that declares `discards_rows = True` (NullSink) drops every row: nothing is
        # buffered for it, and hot paths may skip building rows (`wants`).
        self.discards = bool(getattr(sink, "discards_rows", False))
        # A sink may name the only tables it reads (`reads_tables`, e.g. a server's metrics without
        # a database): the others join `skip` when first emitted, and `wants` says so.
        kept = getattr(sink, "reads_tables", None)
        self.kept: frozenset[str] | None = None if kept is None else frozenset(kept)
        self.flush_interval_s = flush_interval_s
        self._cols: dict[str, dict[str, list[Any]]] = {}
        self._rows: dict[str, int] = {}
        self._countdown = _CLOCK_EVERY
        self._last_flush = time.monotonic()
        self.rows_emitted: dict[str, int] = {}

    def wants(self, table: str) -> bool:
        """Whether rows of `table` reach the sink (not skipped, not dropped by it): callers
        may skip building rows nobody keeps."""
        return (
            not self.discards
            and table not in self.skip
            and (self.kept is None or table in self.kept)
        )

    def emit(self, table: str, columns: Mapping[str, Sequence[Any]]) -> None:
        if self.discards or table in self.skip:
            return
        dst = self._cols.get(table)
        if dst is None:
            if not self.wants(table):
                self.skip = self.skip | {table}
                return
            dst = self._cols[table] = {k: [] for k in columns}
            self._rows[table] = 0
        n = 0
        for k, v in columns.items():
            dst[k].extend(v)
            n = len(v)
        self._rows[table] += n
        if self._rows[table] >= self.batch_rows:
            self._flush_table(table)
        self._countdown -= max(n, 1)
        if self._countdown <= 0:
            self._tick()

    def row(self, table: str, **values: Any) -> None:
        """One row as keyword arguments (the common case on hot paths)."""
        if self.discards or table in self.skip:
            return
        dst = self._cols.get(table)
        if dst is None:
            if not self.wants(table):
                self.skip = self.skip | {table}
                return
            dst = self._cols[table] = {k: [] for k in values}
            self._rows[table] = 0
        for k, v in values.items():
            dst[k].append(v)
        self._rows[table] += 1
        if self._rows[table] >= self.batch_rows:
            self._flush_table(table)
        self._countdown -= 1
        if self._countdown <= 0:
            self._tick()

    def _tick(self) -> None:
        self._countdown = _CLOCK_EVERY
        if time.monotonic() - self._last_flush >= self.flush_interval_s:
            self.flush()

    def _flush_table(self, table: str) -> None:
        cols = self._cols.pop(table, None)
        n = self._rows.pop(table, 0)
        if cols and n:
            self.sink.emit(table, cols)
            self.rows_emitted[table] = self.rows_emitted.get(table, 0) + n

    def flush(self) -> None:
        for table in list(self._cols):
            self._flush_table(table)
        self._last_flush = time.monotonic()
