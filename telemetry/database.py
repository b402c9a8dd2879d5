"""Opening a telemetry database: one check of the path, and connections that stay offline.

Every place pdlab opens a DuckDB file goes through here (SPEC §3). `check_database` looks at
the path before DuckDB does, so a text file, a SQLite or Parquet file, a directory or a
missing folder is a one-line `TelemetryError` naming the path and what it is, never a DuckDB
traceback. `connect` turns off DuckDB's extension autoload and autoinstall: opening a SQLite
file would otherwise make DuckDB try to download its sqlite extension, and pdlab must never
reach the network to read or write telemetry.
"""

from __future__ import annotations

import os
from pathlib import Path

import duckdb

from telemetry.errors import TelemetryError

# DuckDB settings of every connection pdlab opens: no extension is fetched or loaded.
OFFLINE: dict[str, str | bool | int | float | list[str]] = {
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
}
_DUCKDB_MAGIC = b"DUCK"  # bytes 8..12 of every DuckDB database file
_KNOWN_HEADERS: tuple[tuple[bytes, str], ...] = (
    (b"SQLite format 3\x00", "SQLite"),
    (b"PAR1", "Parquet"),
    (b"ARROW1", "Arrow IPC"),
    (b"PK\x03\x04", "a zip archive"),
    (b"\x1f\x8b", "gzip-compressed"),
    (b"{", "JSON text"),
    (b"[", "JSON text"),
)


def _looks_like(head: bytes) -> str:
    for magic, what in _KNOWN_HEADERS:
        if head.startswith(magic):
            return what
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return "an unknown binary format"
    return "text"


def check_database(db_path: str | os.PathLike[str], *, must_exist: bool = False) -> Path:
    """`db_path` as a Path if it is a DuckDB database file or may become one.

    A missing file is fine (DuckDB creates it) unless `must_exist`; its folder must exist.
    Raises `TelemetryError` with one line saying what the path is instead.
    """
    path = Path(db_path)
    if path.is_dir():
        raise TelemetryError(
            f"{path} is a directory, not a DuckDB database (give a file path, e.g. {path / 'pdlab.duckdb'})"
        )
    if not path.exists():
        if must_exist:
            raise TelemetryError(f"database file {str(path)!r} does not exist")
        parent = path.parent
        if not parent.is_dir():
            raise TelemetryError(
                f"cannot create {path}: the folder {parent} does not exist (create it first)"
            )
        return path
    try:
        with path.open("rb") as fh:
            head = fh.read(16)
    except OSError as exc:
        raise TelemetryError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not head:
        raise TelemetryError(
            f"{path} is an empty file, not a DuckDB database (remove it, and pdlab creates one)"
        )
    if head[8:12] != _DUCKDB_MAGIC:
        raise TelemetryError(
            f"{path} is not a DuckDB database (it looks like {_looks_like(head)}): cannot read "
            "it as telemetry; give a DuckDB file, or a path that does not exist yet"
        )
    return path


def connect(
    db_path: str | os.PathLike[str] | None = None, *, read_only: bool = False
) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection (in memory when `db_path` is None) that never loads extensions.

    A file path is checked first (`check_database`); DuckDB's own errors (a lock held by
    another process, a corrupt file) propagate as `duckdb.Error` for the caller's retries.
    """
    if db_path is None:
        return duckdb.connect(config=dict(OFFLINE))
    path = check_database(db_path, must_exist=read_only)
    try:
        return duckdb.connect(os.fspath(path), read_only=read_only, config=dict(OFFLINE))
    except duckdb.ConnectionException as exc:
        if "different configuration" not in str(exc):
            raise
    # This process already holds the file through a connection with other settings (a
    # notebook's own duckdb.connect): join its instance and switch extensions off there.
    con = duckdb.connect(os.fspath(path), read_only=read_only)
    for key, value in OFFLINE.items():
        con.execute(f"SET {key} = {str(value).lower()}")
    return con
