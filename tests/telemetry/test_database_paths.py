"""A --db that is not a DuckDB database is one line naming what it is; DuckDB stays offline."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from telemetry import TelemetryError, TelemetryWriter, live, open_reader, write_rows
from telemetry.database import check_database, connect


@pytest.fixture
def bad_paths(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Paths that are not DuckDB databases, with the words the error must use."""
    text = tmp_path / "notes.duckdb"
    text.write_text("hello\n")
    lite = tmp_path / "other.sqlite"
    con = sqlite3.connect(lite)
    con.execute("CREATE TABLE t (a)")
    con.commit()
    con.close()
    parquet = tmp_path / "rows.duckdb"
    pq.write_table(pa.table({"a": [1]}), parquet)
    empty = tmp_path / "empty.duckdb"
    empty.touch()
    folder = tmp_path / "folder"
    folder.mkdir()
    return {
        "text": (text, "not a DuckDB database (it looks like text)"),
        "sqlite": (lite, "not a DuckDB database (it looks like SQLite)"),
        "parquet": (parquet, "not a DuckDB database (it looks like Parquet)"),
        "empty": (empty, "is an empty file, not a DuckDB database"),
        "directory": (folder, "is a directory, not a DuckDB database"),
        "no folder": (tmp_path / "missing" / "x.duckdb", "the folder"),
    }


def test_every_entry_point_names_what_the_path_is(bad_paths, nodes) -> None:
    for kind, (path, words) in bad_paths.items():
        for attempt in (
            lambda p=path: check_database(p),
            lambda p=path: TelemetryWriter(p, run_id="r"),
            lambda p=path: write_rows(p, "runs", [{"started_at": None}], "r"),
        ):
            with pytest.raises(TelemetryError) as err:
                attempt()
            message = str(err.value)
            assert words in message and "\n" not in message, (kind, message)
        if path.exists():
            with pytest.raises(TelemetryError, match="DuckDB database"):
                open_reader(path)
        # Nothing is left behind next to the bad path (no live directory, no new folder).
        assert not live.live_root(path).exists(), kind
    assert not (bad_paths["no folder"][0].parent).exists()


def test_connections_never_load_or_install_extensions(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    settings = (
        "SELECT current_setting('autoload_known_extensions'), "
        "current_setting('autoinstall_known_extensions')"
    )
    for con in (connect(), connect(db)):
        assert con.execute(settings).fetchone() == (False, False)
        con.close()
    # A notebook's own connection (other settings) to the same file: pdlab joins it offline.
    mine = duckdb.connect(str(db))
    joined = connect(db)
    assert joined.execute(settings).fetchone() == (False, False)
    joined.close()
    mine.close()


def test_the_readers_attach_refuses_a_sqlite_file_without_downloading(bad_paths) -> None:
    path, _ = bad_paths["sqlite"]
    con = connect()
    # DuckDB would try to install its sqlite extension here; offline it fails at once.
    with pytest.raises(duckdb.Error, match=r"(?i)extension"):
        con.execute(f"ATTACH '{path}' AS x (READ_ONLY)")
