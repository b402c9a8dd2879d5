"""Telemetry: the DuckDB schema of SPEC §3, batched writers, live-readable segments, readers.

The iteration logs that feed the iteration-time fits of paper 000 §5.1 (Eq. 1-2), and the
KV, branch and planner events behind its figures, are stored in one DuckDB file per study.

How a run is read while it is written (SPEC §3 "a notebook must be able to read the
telemetry of a run that is still being written"): DuckDB lets a file be open read-write by
one process or read-only by many, never both. So the writer never keeps the file open.

- `TelemetryWriter` registers the run (runs row) and its nodes in short transactions, then
  validates and buffers batches and flushes them as Parquet segments,
  `<db>.live/<run_id>/<table>/<seq:08d>.parquet`, each written to a temporary name and
  `os.replace`d, so a segment is visible whole or not at all.
- Readers (`open_reader`) attach the DB READ_ONLY for the duration of one query or one
  `connect()` block and see each table as a view: the DB table UNION ALL BY NAME the live
  segments of runs not yet listed in `pdlab_live_finalized`.
- `TelemetryWriter.close()` inserts all of the run's segments and its `pdlab_live_finalized`
  row in ONE transaction, then deletes the live directory. A reader that attached before the
  commit blocks it (the writer retries with backoff, ~30 s); one that attaches after sees
  the run finalized and ignores leftover segments, so no row is ever seen twice. While a
  writer waits for the lock it holds a marker file (`<db>.live/.writing-*`, OS-locked), and
  readers hold off new attaches until it is done, so polling readers cannot starve it.
- A writer holds an OS lock on its live directory; `recover(db)` finalizes the runs whose
  writer died (lock free) and leaves running writers alone.
"""

from telemetry.errors import TelemetryError
from telemetry.reader import TelemetryReader, open_reader
from telemetry.schema import SCHEMA_VERSION, TABLES
from telemetry.store import recover, write_rows
from telemetry.transfer import export_run, import_run
from telemetry.writer import TelemetryWriter

__all__ = [
    "SCHEMA_VERSION",
    "TABLES",
    "TelemetryError",
    "TelemetryReader",
    "TelemetryWriter",
    "export_run",
    "import_run",
    "open_reader",
    "recover",
    "write_rows",
]
