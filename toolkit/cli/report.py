"""`pdlab report DB [--run R] -o report.html` (SPEC §7): a run's key figures in one HTML file.

The file is self-contained (plotly.js embedded once), so it opens offline. A database or
run that cannot be read, a table that breaks the schema (telemetry.check) or an unknown
figure name is a clean error with exit code 2; a run that never finished gets a warning; a
figure that fails is shown as an error block in the file and the command exits with 1.
Heavy imports happen inside the command so `pdlab --help` stays fast.
"""

from __future__ import annotations

from pathlib import Path

import typer

EXIT_FIGURE_FAILED = 1
EXIT_INPUT = 2


def report_command(
    db: Path = typer.Argument(..., help="DuckDB telemetry database."),
    run: str | None = typer.Option(
        None, "--run", help="Run to report; optional when DB holds one run."
    ),
    output: Path = typer.Option(Path("report.html"), "-o", "--output", help="HTML file to write."),
    figure: list[str] | None = typer.Option(
        None, "--figure", help="Only this figure (repeatable); default: those the run can fill."
    ),
    window: str | None = typer.Option(
        None,
        "--window",
        metavar="T0:T1",
        help="The pass timeline's window in seconds since the run's start, e.g. 120:125; "
        "default: a few hundred passes around the busiest moment.",
    ),
) -> None:
    """Write a run's summary and key figures to one self-contained HTML file."""
    from telemetry import TelemetryError
    from telemetry.check import precheck
    from toolkit.report import ReportError, write_report

    if not db.exists():
        typer.echo(f"error: database file {str(db)!r} does not exist", err=True)
        raise typer.Exit(EXIT_INPUT)
    try:  # the tables against the schema; whether the run finished
        note = precheck(db, run)
    except TelemetryError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_INPUT) from None
    if note:
        typer.echo(f"warning: {note}", err=True)
    span = None
    if window is not None:
        try:
            lo, hi = (float(x) for x in window.split(":"))
        except ValueError:
            lo = hi = -1.0
        if not 0 <= lo < hi:
            typer.echo(
                f"error: --window {window!r}: expected T0:T1 seconds, 0 <= T0 < T1", err=True
            )
            raise typer.Exit(EXIT_INPUT)
        span = (lo, hi)
    try:
        report = write_report(db, output, run, figure or None, span)
    except ReportError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_INPUT) from None
    shown = len(report.titles) - len(report.failures)
    size_mb = output.stat().st_size / 1e6
    typer.echo(f"wrote {output} ({size_mb:.1f} MB): run {report.run_id}, {shown} figures")
    if report.absent:
        typer.echo(report.absent)
    for failure in report.failures:
        typer.echo(f"error: figure {failure.name} failed: {failure.error}", err=True)
    if report.failures:
        raise typer.Exit(EXIT_FIGURE_FAILED)
