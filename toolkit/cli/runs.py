"""`pdlab runs list|show|rm DB`: the runs a database holds, one run's details, removing runs.

`list` prints one line per run (telemetry.catalog): id, kind (the runs' source: sim,
vllm-bench, sglang-bench, twin, ...), start, end, status and rows (all tables); a twin run
also names the run it replays and is marked FORCED when `pdlab twin --force` made it
against a profile of another model or GPU. `--json` prints a JSON array with one object
per run: {"id", "kind", "started", "finished", "rows", "status", "rows_by_table",
"twin_of", "forced"}.

`show DB RUN` prints the run's rows per table and its configuration (for a twin: the
profile, the guard checks and the interval's sources); `--json` one object.

`rm DB RUN [RUN ...]` deletes each run's rows from every table in one transaction (all or
none) and prints what it removed; twins of a removed run stay (they are runs of their
own) and are named. Exit code 2 for bad input (no such database or run, a run still being
written).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

EXIT_INPUT = 2

runs_app = typer.Typer(
    help="List, show and remove the runs of a telemetry database.", no_args_is_help=True
)


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(EXIT_INPUT)


def _entries(db: Path) -> list[Any]:
    from telemetry import TelemetryError
    from telemetry.catalog import run_catalog
    from telemetry.database import check_database

    try:
        check_database(db, must_exist=True)
        return run_catalog(db)
    except TelemetryError as exc:
        _fail(str(exc))
        return []


def _doc(entry: Any) -> dict[str, Any]:
    doc = entry.to_json()
    doc["twin_of"] = entry.config.get("twin_of")
    doc["forced"] = bool(entry.config.get("forced", False))
    return doc


def _when(doc: dict[str, Any], key: str) -> str:
    value = doc.get(key)
    return "-" if value is None else str(value)[:16].replace("T", " ")


def _took(doc: dict[str, Any]) -> str:
    from datetime import datetime

    if doc.get("started") is None or doc.get("finished") is None:
        return "-"
    s = datetime.fromisoformat(doc["finished"]) - datetime.fromisoformat(doc["started"])
    secs = round(s.total_seconds())
    h, rem = divmod(secs, 3600)
    return f"{h}h{rem // 60:02d}m" if h else f"{rem // 60}m{rem % 60:02d}s"


@runs_app.command("list")
def list_command(
    db: Path = typer.Argument(..., help="DuckDB telemetry database."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON array, one object a run."),
) -> None:
    """List the runs of a database: id, kind, start, end, status, rows."""
    docs = [_doc(e) for e in _entries(db)]
    if as_json:
        typer.echo(json.dumps(docs))
        return
    from rich.console import Console

    cols = ("id", "kind", "started", "took", "rows")
    rows, notes = [], []
    for d in docs:
        note = []
        if d["status"] not in ("finished", "unknown"):
            note.append(d["status"])
        if d["twin_of"]:
            note.append(f"twin of {d['twin_of']}")
        if d["forced"]:
            note.append("[bold red]FORCED[/]: made with --force, a profile of another model/GPU")
        rows.append([d["id"], d["kind"] or "-", _when(d, "started"), _took(d), f"{d['rows']:,}"])
        notes.append("; ".join(note))
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(cols)]

    def line(values: list[str]) -> str:
        return "  ".join(
            v.rjust(w) if c in ("took", "rows") else v.ljust(w)
            for c, v, w in zip(cols, values, widths, strict=True)
        )

    out = Console(highlight=False)
    out.print(f"{len(docs)} run{'s' * (len(docs) != 1)} in {db} (took: start to end)")
    out.print(f"[bold]{line(list(cols))}[/]")
    for r, note in zip(rows, notes, strict=True):
        out.print(line(r))
        if note:
            out.print(f"  {note}")


@runs_app.command("show")
def show_command(
    db: Path = typer.Argument(..., help="DuckDB telemetry database."),
    run: str = typer.Argument(..., help="Run id (see `pdlab runs list`)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """One run: rows per table and its configuration."""
    entries = {e.run_id: e for e in _entries(db)}
    if run not in entries:
        _fail(f"unknown run {run!r} in {db}; runs: {', '.join(entries) or 'none'}")
    e = entries[run]
    doc = _doc(e) | {"config": e.config}
    if as_json:
        typer.echo(json.dumps(doc, default=str))
        return
    from rich.console import Console

    out = Console()
    out.print(
        f"[bold]{e.run_id}[/] ({e.kind or 'no runs row'}, {e.status}): started "
        f"{_when(doc, 'started')}, finished {_when(doc, 'finished')}",
        highlight=False,
    )
    if doc["forced"]:
        out.print(
            "[bold red]FORCED:[/] made with --force against a profile of another model or "
            "GPU; its numbers describe that profile, not this run's hardware"
        )
    out.print("rows: " + ", ".join(f"{t} {n:,}" for t, n in e.rows.items()), highlight=False)
    out.print_json(json.dumps(e.config, default=str))


@runs_app.command("rm")
def rm_command(
    db: Path = typer.Argument(..., help="DuckDB telemetry database."),
    runs: list[str] = typer.Argument(..., help="Run id(s) to remove."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Remove runs: every table's rows of each, in one transaction."""
    from telemetry import TelemetryError
    from telemetry.catalog import remove_runs, runs_referring_to

    entries = _entries(db)
    try:
        removed = remove_runs(db, runs)
    except TelemetryError as exc:
        _fail(str(exc))
        return
    left = {r: [t for t in runs_referring_to(entries, r) if t not in removed] for r in removed}
    if as_json:
        typer.echo(json.dumps({"removed": removed, "twins_left": left}))
        return
    for rid, rows in removed.items():
        typer.echo(
            f"removed run {rid}: "
            + (", ".join(f"{t} {n:,} rows" for t, n in rows.items()) or "no rows")
        )
        if left[rid]:
            typer.echo(f"  its twin run(s) stay: {', '.join(left[rid])} (remove them by id)")
