"""The batched telemetry writer of one run (SPEC §3: Arrow batches, never one INSERT per event).

Batches are validated at the boundary, buffered per table as Arrow tables, and flushed as
atomically renamed Parquet segments under `<db>.live/<run_id>/` so other processes can read
the run while it is written. `close()` consolidates the segments into the DuckDB file in one
transaction. The runs row and nodes rows go to the DB at once (short transactions): they
are small, they make the run visible, and node references are validated against them.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import pyarrow as pa

from telemetry import database, live, store
from telemetry.errors import TelemetryError
from telemetry.validate import check_new_nodes, validate_batch


def new_run_id(now: datetime | None = None) -> str:
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%S")
    return f"run-{stamp}-{secrets.token_hex(3)}"


def _naive_utc(ts: datetime) -> datetime:
    return ts if ts.tzinfo is None else ts.astimezone(UTC).replace(tzinfo=None)


class TelemetryWriter:
    """Writes one run; implements `cluster.core.TelemetrySink` (`emit`). Not thread-safe.

    Rows become visible to readers when flushed: when a table's buffer reaches
    `segment_rows`, when `flush_interval_s` has passed since the last flush (checked on
    append: an idle writer keeps its buffer until `flush()`), and on `close()`. So a writer
    killed mid-run leaves at most the last few seconds of rows unwritten; `recover(db)`
    (`pdlab recover DB`) folds the rest into the database.

    `close()` records the run as finished; `abort(reason)` (and leaving a `with` block on an
    exception) records it as failed, keeping its rows, or removes it when it holds nothing
    but its runs and nodes rows, so a failed start leaves no empty run behind.
    """

    def __init__(
        self,
        db_path: str | os.PathLike[str],
        run_id: str | None = None,
        source: str = "sim",
        config: Mapping[str, Any] | None = None,
        started_at: datetime | None = None,
        segment_rows: int = 200_000,
        flush_interval_s: float = 2.0,
        *,
        lock_timeout_s: float = store.LOCK_TIMEOUT_S,
        compression: str = live.SEGMENT_COMPRESSION,
    ) -> None:
        if segment_rows < 1:
            raise TelemetryError(f"segment_rows must be >= 1, got {segment_rows}")
        self.db_path = Path(db_path)
        self.run_id = live.check_run_id(run_id if run_id is not None else new_run_id())
        self.segment_rows = segment_rows
        self.flush_interval_s = flush_interval_s
        self.lock_timeout_s = lock_timeout_s
        self.compression = compression
        self.rows_written: dict[str, int] = {}
        self._buffers: dict[str, list[pa.Table]] = {}
        self._buffered: dict[str, int] = {}
        self._seq: dict[str, int] = {}
        self._node_ids: set[int] = set()
        self._closed = False
        self._last_flush = time.monotonic()
        try:
            config_json = None if config is None else json.dumps(config, sort_keys=True)
        except (TypeError, ValueError) as exc:
            raise TelemetryError(f"runs: config must be JSON-serializable ({exc})") from None
        database.check_database(self.db_path)
        runs_row = validate_batch(
            "runs",
            {
                "started_at": [_naive_utc(started_at or datetime.now(UTC))],
                "source": [source],
                "config": [config_json],
            },
            self.run_id,
        )
        self.live_dir = live.make_run_dir(self.db_path, self.run_id)
        self._lock = live.RunLock(self.live_dir / live.LOCK_NAME)
        try:
            if not self._acquire_lock():
                raise TelemetryError(f"run {self.run_id!r} is locked by another writer")
            with store.transaction(self.db_path, lock_timeout_s, "register the run") as con:
                if store.run_exists(con, self.db_path, self.run_id):
                    raise TelemetryError(f"run {self.run_id!r} already exists in {self.db_path}")
                store.insert(con, "runs", runs_row)
            self._write("runs", runs_row)
        except BaseException:
            self._lock.release()
            live.remove_run_dir(self.live_dir)
            raise

    def _acquire_lock(self) -> bool:
        # A reader probing whether this run's writer is alive holds the lock for a moment.
        deadline = time.monotonic() + 0.5
        while not self._lock.try_acquire():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    @property
    def closed(self) -> bool:
        return self._closed

    def buffered_rows(self, table: str | None = None) -> int:
        """Rows validated but not yet flushed (all tables when `table` is None)."""
        if table is None:
            return sum(self._buffered.values())
        return self._buffered.get(table, 0)

    def add_nodes(self, rows: Any) -> None:
        """Register nodes of the run (SPEC §3 nodes table); written to the DB at once."""
        self._check_open()
        batch = validate_batch("nodes", rows, self.run_id)
        check_new_nodes(batch, self._node_ids)
        if batch.num_rows == 0:
            return
        with store.transaction(self.db_path, self.lock_timeout_s, "register nodes") as con:
            store.insert(con, "nodes", batch)
        self._node_ids.update(batch.column("node_id").to_pylist())
        self._write("nodes", batch)

    def append(self, table: str, data: Any) -> None:
        """Validate a batch of `table` rows and buffer it; a rejected batch leaves no trace."""
        self._check_open()
        if table == "runs":
            raise TelemetryError(
                "the runs row is written by TelemetryWriter(...); append other tables"
            )
        if table == "nodes":
            self.add_nodes(data)
            return
        batch = validate_batch(table, data, self.run_id, self._node_ids)
        if batch.num_rows:
            self._buffers.setdefault(table, []).append(batch)
            self._buffered[table] = self._buffered.get(table, 0) + batch.num_rows
            if self._buffered[table] >= self.segment_rows:
                self._flush_table(table)
        if time.monotonic() - self._last_flush >= self.flush_interval_s:
            self.flush()

    def emit(self, table: str, columns: Mapping[str, Sequence[Any]]) -> None:
        self.append(table, columns)

    def flush(self) -> None:
        """Write every buffered table as one Parquet segment; readers see the rows afterwards.

        Raises TelemetryError when segments written before are gone (the run's live
        directory or a table's first or last segment removed): the rows in them are lost
        and the run must not end as finished (checked cheaply here, fully by `close`)."""
        for table in list(self._buffers):
            self._flush_table(table)
        self._last_flush = time.monotonic()
        self._check_segments()

    def _check_segments(self) -> None:
        """O(tables) stats: the lock file, and each table's first and last segment."""
        gone = [] if (self.live_dir / live.LOCK_NAME).exists() else [live.LOCK_NAME]
        for table, n in self._seq.items():
            folder = self.live_dir / table
            for seq in {0, n - 1}:
                if not (folder / f"{seq:08d}.parquet").exists():
                    gone.append(f"{table}/{seq:08d}.parquet")
        if gone:
            raise TelemetryError(
                f"run {self.run_id!r}: live segments removed while the run was written "
                f"({', '.join(gone[:4])}{', ...' if len(gone) > 4 else ''} in {self.live_dir}); "
                "their rows are lost"
            )

    def lost_rows(self) -> dict[str, tuple[int, int]]:
        """Table -> (rows written, rows still in its segments) where segments went missing
        (read from the Parquet footers of every segment: what `close` checks)."""
        found = store.segment_rows(live.segments(self.db_path, self.run_id))
        return {
            t: (n, found.get(t, 0))
            for t, n in self.rows_written.items()
            if found.get(t, 0) < n and t not in live.WRITTEN_THROUGH
        }

    def close(self) -> None:
        """Flush, then move the run's segments into the DB in one transaction.

        If the DB stays locked (a reader holds it) past `lock_timeout_s`, raises
        `TelemetryError`; the segments stay in place and `close()` may be called again, or
        `telemetry.recover(db)` run later.
        """
        if self._closed:
            return
        try:
            self.flush()
        except TelemetryError as exc:
            self._fail_lost(str(exc))
        lost = self.lost_rows()
        if lost:
            self._fail_lost(
                f"run {self.run_id!r}: rows lost before the run was stored (live segments "
                "removed while it was written): "
                + ", ".join(f"{t} {n - k} of {n}" for t, (n, k) in sorted(lost.items()))
            )
        store.finalize_run(self.db_path, self.run_id, self.lock_timeout_s)
        self._finish()

    def _fail_lost(self, reason: str) -> None:
        """Store what is left as a failed run (status 'failed', `reason`), then raise."""
        self.abort(reason)
        raise TelemetryError(reason)

    def abort(self, reason: str) -> None:
        """End the run as failed (`reason` is stored with it), keeping the rows written so far.

        A run that holds nothing but its runs and nodes rows is removed instead, from the
        database and the live directory. Raises `TelemetryError` if the database stays
        locked; then the segments stay and `recover(db)` finalizes them later.
        """
        if self._closed:
            return
        data_rows = sum(n for t, n in self.rows_written.items() if t not in live.WRITTEN_THROUGH)
        if data_rows + self.buffered_rows() == 0:
            what = f"remove the failed run {self.run_id!r}"
            with store.transaction(self.db_path, self.lock_timeout_s, what) as con:
                store.remove_run(con, self.run_id)
        else:
            try:
                self.flush()
            except TelemetryError as exc:  # segments gone: store what is left, say so
                reason = f"{reason}; {exc}" if str(exc) not in reason else reason
            store.finalize_run(
                self.db_path, self.run_id, self.lock_timeout_s, "failed", reason[:500]
            )
        self._finish()

    def _finish(self) -> None:
        self._closed = True
        self._lock.release()
        live.remove_run_dir(self.live_dir)

    def __enter__(self) -> TelemetryWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
            return
        # What was validly written is kept (marked failed), the exception propagates.
        self.abort(f"{exc_type.__name__}: {exc}" if str(exc) else exc_type.__name__)

    def _check_open(self) -> None:
        if self._closed:
            raise TelemetryError(f"the writer of run {self.run_id!r} is closed")

    def _flush_table(self, table: str) -> None:
        batches = self._buffers.get(table)
        if batches:
            self._write(table, pa.concat_tables(batches))
        # Dropped only once the segment exists: a failed write keeps the rows buffered.
        self._buffers.pop(table, None)
        self._buffered.pop(table, None)

    def _write(self, table: str, data: pa.Table) -> None:
        seq = self._seq.get(table, 0)
        live.write_segment(self.live_dir, table, seq, data, self.compression)
        self._seq[table] = seq + 1
        self.rows_written[table] = self.rows_written.get(table, 0) + data.num_rows
