"""Parquet export and import of one run (SPEC §3), e.g. to move a run between databases.

An export directory holds `<table>.parquet` for every SPEC §3 table (empty ones included)
and `manifest.json` with the schema version, run id and row counts. Import validates every
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
from telemetry.schema import SCHEMA_VERSION, TABLES, arrow_schema
from telemetry.validate import check_new_nodes, constant_string, validate_batch

MANIFEST = "manifest.json"
FORMAT = "pdlab-run"


def export_run(
    db_path: str | os.PathLike[str], run_id: str | None, out_dir: str | os.PathLike[str]
) -> Path:
    """Write the run's rows (finalized or live) as one Parquet file per table plus a manifest."""
    reader = TelemetryReader(db_path)
    rid = reader.resolve_run(run_id)
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise TelemetryError(f"refusing to export into {out}: the directory is not empty")
    out.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    with reader.connect() as con:
        for table in TABLES:
            schema = arrow_schema(table)
            cols = ", ".join(f'"{n}"' for n in schema.names)
            data = con.sql(
                f"SELECT {cols} FROM {table} WHERE run_id = ?", params=[rid]
            ).to_arrow_table()
            data = pa.Table.from_arrays(
                [data.column(n).cast(f.type) for n, f in zip(schema.names, schema, strict=True)],
                schema=schema,
            )
            pq.write_table(data, out / f"{table}.parquet", compression="zstd")
            counts[table] = data.num_rows
    manifest = {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "run_id": rid,
        "exported_at": datetime.now(UTC).isoformat(),
        "tables": counts,
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
