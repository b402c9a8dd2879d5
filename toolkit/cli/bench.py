"""`pdlab bench`: run the registered benchmark suites (SPEC §8) and print their figures.

Suites live in toolkit.bench.SUITES; each returns a flat dict of figures. With --json the
command prints exactly one JSON object (the merged figures); otherwise a rich table.
"""

from __future__ import annotations

import json

import typer


def bench_command(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    quick: bool = typer.Option(False, "--quick", help="Smaller problem sizes (a smoke run)."),
    suite: list[str] | None = typer.Option(
        None, "--suite", help="Run only this suite (repeatable)."
    ),
) -> None:
    """Measure the SPEC §8 targets (throughputs, latencies, fit time) on this machine."""
    from toolkit.bench import SUITES, run_benchmarks

    if suite:
        unknown = [s for s in suite if s not in SUITES]
        if unknown:
            typer.echo(
                f"error: unknown bench suite(s) {unknown}; choose from: {', '.join(SUITES)}",
                err=True,
            )
            raise typer.Exit(2)
    from toolkit.extras import torch_missing

    names = list(suite or SUITES)
    if "engine" in names and (missing := torch_missing("the engine bench")) is not None:
        if suite:  # asked for by name
            typer.echo(f"error: {missing}", err=True)
            raise typer.Exit(2)
        typer.echo(f"note: skipping the engine suite: {missing}", err=True)
        names.remove("engine")
    figures = run_benchmarks(names, quick=quick)
    if as_json:
        typer.echo(json.dumps(figures))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="pdlab bench" + (" (quick)" if quick else ""))
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in figures.items():
        table.add_row(key, f"{value:,.4g}" if isinstance(value, float) else str(value))
    Console().print(table)
