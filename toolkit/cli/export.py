"""`pdlab export DB --run RUN --format parquet|csv -o DIR`: one run's rows, a file per table.

Every SPEC §3 table's rows of the run (its live segments too, while it runs), one file per
table (empty tables included, so a reader finds every table), and `manifest.json`: run id,
source, status, schema version, per table the file and its rows (telemetry.transfer). A
Parquet export is what `telemetry.import_run` reads back into another database.
"""

from __future__ import annotations

from pathlib import Path

import typer


def export_command(
    db: Path = typer.Argument(..., help="DuckDB telemetry database."),
    run: str | None = typer.Option(
        None, "--run", help="Run to export; optional when DB holds one run."
    ),
    file_format: str = typer.Option("parquet", "--format", help="parquet | csv"),
    output: Path = typer.Option(
        ..., "-o", "--output", help="Directory of the export (created; must be empty)."
    ),
    force: bool = typer.Option(
        False, "--force", help="Export into a directory that holds files (replacing the export's)."
    ),
) -> None:
    """Export one run: every table's rows as Parquet or CSV files, plus a manifest."""
    import json

    from telemetry.errors import TelemetryError
    from telemetry.reader import open_reader
    from telemetry.transfer import FILE_FORMATS, MANIFEST, export_run

    if file_format not in FILE_FORMATS:
        typer.echo(
            f"error: --format must be one of {', '.join(FILE_FORMATS)}, got {file_format!r}",
            err=True,
        )
        raise typer.Exit(2)
    try:
        open_reader(db)  # a missing file is one line, not an empty export
        out = export_run(db, run, output, file_format, overwrite=force)
    except TelemetryError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    manifest = json.loads((out / MANIFEST).read_text())
    rows = manifest["tables"]
    filled = sum(1 for n in rows.values() if n)
    typer.echo(
        f"exported run {manifest['run_id']} ({manifest['status']}): {sum(rows.values()):,} rows "
        f"in {filled} of {len(rows)} tables as {file_format} to {out} (manifest: {MANIFEST})"
    )
