"""The live-segment directory that makes a run readable while it is written (SPEC §3).

Layout: `<db>.live/<run_id>/<table>/<seq:08d>.parquet`. A segment is written under a
temporary name and renamed with `os.replace`, so a reader that lists `*.parquet` never sees
a partial file. The run's writer holds an OS file lock on `<run_id>/.writer.lock` for its
whole life; the OS drops it when the process dies, which is how `recover` tells a crashed
writer's run (lock free) from one still being written (lock held).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pyarrow as pa
import pyarrow.parquet as pq

from telemetry.errors import TelemetryError

LIVE_SUFFIX = ".live"
LOCK_NAME = ".writer.lock"
# lz4: segments ~2x smaller than uncompressed at little cost; zstd costs ~30% of ingest rate.
SEGMENT_COMPRESSION = "lz4"
# runs and nodes rows are also written straight into the DB when the writer registers them;
# their live copies only matter when the DB lacks the row (key), e.g. the DB file is missing.
WRITTEN_THROUGH: dict[str, tuple[str, ...]] = {"runs": ("run_id",), "nodes": ("run_id", "node_id")}

# A writer waiting for the DB lock holds a marker; readers hold off new attaches while one
# is held, so a reader polling in a loop cannot starve the writer's commit.
WRITE_MARKER = ".writing-"

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id):
        raise TelemetryError(
            f"invalid run id {run_id!r}: allowed are 1-128 characters of letters, digits, "
            "'.', '_' and '-', starting with a letter or digit (it names a directory)"
        )
    return run_id


def live_root(db_path: str | os.PathLike[str]) -> Path:
    return Path(os.fspath(db_path) + LIVE_SUFFIX)


def run_dir(db_path: str | os.PathLike[str], run_id: str) -> Path:
    return live_root(db_path) / run_id


def live_run_ids(db_path: str | os.PathLike[str]) -> list[str]:
    root = live_root(db_path)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and _RUN_ID.match(p.name))


def segments(db_path: str | os.PathLike[str], run_id: str) -> dict[str, list[Path]]:
    """Table -> the run's complete segment files, in write order."""
    base = run_dir(db_path, run_id)
    if not base.is_dir():
        return {}
    out: dict[str, list[Path]] = {}
    for table_dir in sorted(p for p in base.iterdir() if p.is_dir()):
        files = sorted(table_dir.glob("*.parquet"))
        if files:
            out[table_dir.name] = files
    return out


def write_segment(
    base: Path, table: str, seq: int, data: pa.Table, compression: str = SEGMENT_COMPRESSION
) -> Path:
    folder = base / table
    if not base.is_dir():  # never recreate a run directory someone removed: rows would vanish
        raise TelemetryError(
            f"the run's live directory {base} is gone (removed while the run was written); "
            f"{table} rows cannot be stored"
        )
    folder.mkdir(exist_ok=True)
    final = folder / f"{seq:08d}.parquet"
    tmp = folder / f"{seq:08d}.parquet.tmp"
    # Dictionary-encode only strings (run_id repeats on every row); on numeric columns of
    # iteration logs dictionaries cost ~4x the write time and save little.
    strings = [f.name for f in data.schema if pa.types.is_string(f.type)]
    pq.write_table(data, tmp, compression=compression, use_dictionary=strings)
    os.replace(tmp, final)  # atomic: readers see the whole segment or none of it
    return final


def make_run_dir(db_path: str | os.PathLike[str], run_id: str) -> Path:
    """Claim the run's live directory; it must not exist yet."""
    base = run_dir(db_path, check_run_id(run_id))
    for _ in range(5):  # another run's cleanup may remove the empty root between our mkdirs
        try:
            base.mkdir(parents=True)
            return base
        except FileNotFoundError:
            continue
        except FileExistsError:
            raise TelemetryError(
                f"run {run_id!r} already has live segments in {base} (a writer is running, or "
                "one crashed: telemetry.recover(db) finalizes it)"
            ) from None
    raise TelemetryError(f"could not create {base}")


def remove_run_dir(base: Path) -> None:
    shutil.rmtree(base, ignore_errors=True)
    root = base.parent
    with contextlib.suppress(OSError):  # only succeeds when no other run is live
        root.rmdir()


@contextlib.contextmanager
def write_intent(db_path: str | os.PathLike[str]) -> Iterator[None]:
    """Mark that this process wants the DB lock (held as an OS lock: dies with the process)."""
    root = live_root(db_path)
    root.mkdir(parents=True, exist_ok=True)
    marker = RunLock(root / f"{WRITE_MARKER}{os.getpid()}-{secrets.token_hex(4)}")
    marker.try_acquire()
    try:
        yield
    finally:
        marker.release()
        marker.path.unlink(missing_ok=True)


def wait_for_writers(db_path: str | os.PathLike[str], timeout_s: float) -> None:
    """Wait (at most `timeout_s`) while a writer of another connection wants the DB lock."""
    root = live_root(db_path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        waiting = False
        for path in root.glob(WRITE_MARKER + "*"):
            probe = RunLock(path)
            if probe.try_acquire():  # nobody holds it: a dead writer's (or a finished) marker
                probe.release()
                path.unlink(missing_ok=True)
            else:
                waiting = True
        if not waiting:
            return
        time.sleep(0.01)


class RunLock:
    """An exclusive, non-blocking OS lock on a file; released by the OS if the process dies."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh: IO[bytes] | None = None

    @property
    def held(self) -> bool:
        return self._fh is not None

    def try_acquire(self) -> bool:
        fh = open(self.path, "a+b")  # noqa: SIM115 - the handle lives as long as the lock
        try:
            _lock(fh)
        except OSError:
            fh.close()
            return False
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()).encode())
        fh.flush()
        self._fh = fh
        return True

    def release(self) -> None:
        if self._fh is not None:
            try:
                _unlock(self._fh)
            finally:
                self._fh.close()
                self._fh = None


if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
    import msvcrt

    def _lock(fh: IO[bytes]) -> None:
        fh.seek(0)
        msvcrt.locking(fh.fileno(), msvcrt.LK_NBLCK, 1)

    def _unlock(fh: IO[bytes]) -> None:
        fh.seek(0)
        msvcrt.locking(fh.fileno(), msvcrt.LK_UNLCK, 1)

else:
    import fcntl

    def _lock(fh: IO[bytes]) -> None:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)

    def _unlock(fh: IO[bytes]) -> None:
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
