"""`pdlab recover DB`: fold the live segments of crashed runs into the database (SPEC §3).

A writer that dies without closing its run (`kill -9`, a power cut, an out-of-memory kill)
leaves its rows in `<db>.live/<run_id>/` as Parquet segments; readers, `pdlab fit` and
`pdlab report` already see them and say the run never finished. `pdlab recover DB` inserts
them into the database in one transaction per run and marks each run `recovered`, so the
database holds the rows on its own (for copying, for tools that read the file directly).
Runs whose writer is still running are left alone. Exit code 2 for a database that cannot
be read; 0 otherwise, also when there was nothing to recover.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

EXIT_INPUT = 2


def recover_command(
    db: Path = typer.Argument(..., help="DuckDB telemetry database whose crashed runs to fold in."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Fold the live segments of crashed runs into the database and mark them recovered."""
    from telemetry import TelemetryError, live, open_reader, recover
    from telemetry.database import check_database
    from telemetry.status import writer_alive

    try:
        check_database(db, must_exist=not live.live_run_ids(db))
        running = [r for r in live.live_run_ids(db) if writer_alive(db, r)]
        recovered = recover(db)
        reader = open_reader(db)
        details = {r: reader.run_state(r).detail for r in recovered}
    except TelemetryError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_INPUT) from None
    if as_json:
        out = {"db": str(db), "recovered": details, "running": running}
        typer.echo(json.dumps(out))
        return
    for run_id, detail in details.items():
        typer.echo(f"recovered run {run_id}: {detail}; marked 'recovered'")
    for run_id in running:
        typer.echo(f"left run {run_id} alone: its writer is still running")
    if not details and not running:
        typer.echo(f"nothing to recover in {db}: no run was left unfinished")
