"""Export (Parquet or CSV) and import (Parquet) of one run (SPEC §3): `pdlab export`, or to
move a run between databases.

An export directory holds `<table>.parquet` (or `.csv`) for every SPEC §3 table (empty ones
included) and `manifest.json` with the schema version, run id, source, status and row
counts. Import validates every
table at the boundary, refuses a run id the database already has, and inserts all tables
in one transaction, so a failed import leaves the database unchanged.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from telemetry import live, store
from telemetry.errors import TelemetryError
from telemetry.reader import TelemetryReader
from telemetry.schema import SCHEMA_VERSION, TABLES
from telemetry.validate import check_new_nodes, constant_string, validate_batch

MANIFEST = "manifest.json"
FORMAT = "pdlab-run"
FILE_FORMATS = ("parquet", "csv")


def export_run(
    db_path: str | os.PathLike[str],
    run_id: str | None,
    out_dir: str | os.PathLike[str],
    file_format: str = "parquet",
    overwrite: bool = False,
) -> Path:
    """Write the run's rows (finalized or live) as one file per table plus a manifest.

    `file_format` "parquet" (zstd; what `import_run` reads back) or "csv" (a header row;
    lists and structs as DuckDB writes them). DuckDB streams each table to its file, so
    a run larger than memory exports too. The manifest names the run, its source (kind),
    status and start, and per table the file and its rows. An output directory holding
    files is refused unless `overwrite` (then only the export's own files are replaced).
    """
    if file_format not in FILE_FORMATS:
        raise TelemetryError(
            f"unknown export format {file_format!r}; formats: {', '.join(FILE_FORMATS)}"
        )
    reader = TelemetryReader(db_path)
    rid = reader.resolve_run(run_id)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise TelemetryError(f"refusing to export into {out}: it is a file, not a directory")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise TelemetryError(
            f"refusing to export into {out}: the directory is not empty (--force replaces "
            "the export's files)"
        )
    out.mkdir(parents=True, exist_ok=True)
    options = (
        "FORMAT parquet, COMPRESSION zstd" if file_format == "parquet" else "FORMAT csv, HEADER"
    )
    counts: dict[str, int] = {}
    files: dict[str, str] = {}
    with reader.connect() as con:  # one attach: every table of the same moment of the run
        run = con.execute("SELECT source, started_at FROM runs WHERE run_id = ?", [rid]).fetchall()
        for table in TABLES:
            # each column as the schema types it (JSON as its text: what import validates)
            cols = ", ".join(
                f'CAST("{c.name}" AS {"VARCHAR" if c.sql == "JSON" else c.sql}) AS "{c.name}"'
                for c in TABLES[table]
            )
            name = f"{table}.{file_format}"
            target = out / name
            query = f"SELECT {cols} FROM {table} WHERE run_id = {store.sql_str(rid)}"
            got = con.execute(f"COPY ({query}) TO {store.sql_str(target)} ({options})")
            counts[table] = int(got.fetchone()[0])  # COPY answers the rows it wrote
            files[table] = name
    state = reader.run_state(rid)
    manifest = {
        "format": FORMAT,
        "file_format": file_format,
        "schema_version": SCHEMA_VERSION,
        "run_id": rid,
        "source": run[0][0] if run else None,
        "started_at": run[0][1].isoformat() if run and run[0][1] is not None else None,
        "status": state.status,
        "database": str(Path(db_path).resolve()),
        "exported_at": datetime.now(UTC).isoformat(),
        "tables": counts,
        "files": files,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return out


def _read_manifest(src: Path) -> dict[str, object]:
    try:
        manifest = json.loads((src / MANIFEST).read_text())
    except FileNotFoundError:
        raise TelemetryError(f"{src} is not a run export: {MANIFEST} is missing") from None
    except json.JSONDecodeError as exc:
        raise TelemetryError(f"{src / MANIFEST} is not valid JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise TelemetryError(f"{src / MANIFEST} is not a pdlab run manifest (format {FORMAT!r})")
    if manifest.get("file_format", "parquet") != "parquet":
        raise TelemetryError(
            f"{src} holds a {manifest['file_format']} export; only a Parquet export can be "
            "imported (pdlab export --format parquet)"
        )
    version = manifest.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise TelemetryError(
            f"{src} was exported with telemetry schema version {version}; this pdlab reads up to "
            f"version {SCHEMA_VERSION}"
        )
    return manifest


def import_run(
    db_path: str | os.PathLike[str], in_dir: str | os.PathLike[str], run_id: str | None = None
) -> str:
    """Import an exported run (under `run_id` if given, else its own id); returns the id."""
    src = Path(in_dir)
    manifest = _read_manifest(src)
    source_id = str(manifest["run_id"])
    target_id = live.check_run_id(run_id if run_id is not None else source_id)
    unknown = sorted(p.name for p in src.glob("*.parquet") if p.stem not in TABLES)
    if unknown:
        raise TelemetryError(f"{src}: unknown table file(s) {', '.join(unknown)}")
    if not (src / "runs.parquet").exists():
        raise TelemetryError(f"{src}: runs.parquet is missing")
    batches: dict[str, pa.Table] = {}
    node_ids: set[int] = set()
    for table in TABLES:  # runs and nodes come first, so node references can be checked
        path = src / f"{table}.parquet"
        if not path.exists():
            continue
        batch = validate_batch(table, pq.read_table(path), source_id, node_ids)
        if table == "runs" and batch.num_rows != 1:
            raise TelemetryError(
                f"{path}: a run export holds exactly one runs row, found {batch.num_rows}"
            )
        if table == "nodes":
            check_new_nodes(batch, ())
            node_ids = set(batch.column("node_id").to_pylist())
        if target_id != source_id:
            batch = batch.set_column(
                0, batch.schema.field(0), constant_string(target_id, batch.num_rows)
            )
        batches[table] = batch
    db = Path(db_path)
    with store.transaction(db, what=f"import run {target_id!r}") as con:
        if store.run_exists(con, db, target_id) or live.run_dir(db, target_id).exists():
            raise TelemetryError(
                f"run {target_id!r} already exists in {db}; import it under another id (run_id=...)"
            )
        for table, batch in batches.items():
            if batch.num_rows:
                store.insert(con, table, batch)
    return target_id
