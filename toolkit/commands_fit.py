"""`pdlab fit` and `pdlab synth-logs` (SPEC §7; paper 000 §5.1 iteration-time models).

`pdlab fit DB` fits Eq. 1 / Eq. 2 per node of one run (toolkit.fitting), prints a rich
table or, with --json, exactly one JSON object on stdout, and stores the fits in
`model_fits`. A node whose data cannot determine a model gets a message in its entry and
the command still succeeds; a database that cannot be fitted at all (missing file or
tables, unknown run, several runs without --run) is a clean error with exit code 2.
Heavy imports happen inside the commands so `pdlab --help` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

EXIT_INPUT = 2


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(EXIT_INPUT)


def _coef_cell(fit: Any, terms: tuple[str, ...]) -> str:
    """One line per coefficient with its CI; the entry's message (dim, or red on failure)."""
    if not fit.ok:
        return f"[red]not fitted: {escape(fit.message or '')}[/red]"
    lines = []
    for i, (term, value) in enumerate(zip(terms, fit.coef, strict=True)):
        line = f"{term} = {value:.4e}"
        if term in fit.fixed:
            line += "  (fixed)"
        elif fit.ci is not None:
            lo, hi = fit.ci[i]
            line += f"  [{lo:.3e}, {hi:.3e}]"
        lines.append(line)
    if fit.message:
        lines.append(f"[dim]{escape(fit.message)}[/dim]")
    return "\n".join(lines)


def _print_table(result: Any, written: int | None) -> None:
    from rich.console import Console
    from rich.table import Table

    from models.fitting import DECODE_TERMS, PREFILL_TERMS

    table = Table(
        title=f"iteration-time fits of run {result.run_id}",
        caption="coefficients in seconds with bootstrap 95% CIs; MAPE on held-out iterations",
        show_lines=True,
    )
    table.add_column("node", justify="right")
    table.add_column("phase")
    table.add_column("coefficients", overflow="fold", min_width=36)
    table.add_column("MAPE", justify="right")
    table.add_column("fit/test", justify="right")
    for node in result.nodes:
        for fit, terms in ((node.prefill, PREFILL_TERMS), (node.decode, DECODE_TERMS)):
            mape = f"{100 * fit.mape:.2f}%" if fit.mape is not None else "-"
            samples = f"{fit.samples}/{fit.samples_test}"
            table.add_row(str(node.node_id), fit.phase, _coef_cell(fit, terms), mape, samples)
    console = Console()
    console.print(table)
    if written is not None:
        console.print(f"{written} rows written to model_fits")


def fit_command(
    db: Path = typer.Argument(
        ..., help="DuckDB telemetry database (any file with the SPEC §3 tables)."
    ),
    run: str | None = typer.Option(
        None, "--run", help="Run to fit; optional when DB holds one run."
    ),
    node: list[int] | None = typer.Option(None, "--node", help="Fit only this node (repeatable)."),
    holdout: float = typer.Option(
        0.2, "--holdout", help="Fraction of iterations held out for MAPE, in [0, 1)."
    ),
    bootstrap: int = typer.Option(
        200, "--bootstrap", help="Bootstrap resamples for the 95% CIs (0: none)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the bootstrap."),
    write: bool = typer.Option(True, "--write/--no-write", help="Store the fits in model_fits."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
) -> None:
    """Fit prefill (Eq. 1) and decode (Eq. 2) iteration-time models per node of a run."""
    from toolkit.fitting import FitInputError, fit_run, save_fits, to_json

    try:
        result = fit_run(db, run, node, holdout=holdout, bootstrap=bootstrap, seed=seed)
        written = save_fits(db, result) if write else None
    except FitInputError as exc:
        _fail(str(exc))
        return
    if as_json:
        out = to_json(result)
        out["model_fits_written"] = written or 0
        typer.echo(json.dumps(out))
    else:
        _print_table(result, written)


def synth_logs_command(
    db: Path = typer.Argument(..., help="DuckDB file to write (created if absent)."),
    nodes: int = typer.Option(4, "--nodes", help="Number of nodes.", min=1),
    seed: int = typer.Option(0, "--seed", help="Random seed."),
    iterations: int = typer.Option(
        5000, "--iterations", help="Prefill and decode iterations per node.", min=0
    ),
    run: str | None = typer.Option(None, "--run", help="Run id (default: a fresh synth-… id)."),
    noise: float = typer.Option(
        0.03, "--noise", help="Sigma of the multiplicative lognormal noise."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Write synthetic iteration logs from known coefficients (a demo and a fitting check)."""
    import duckdb

    from toolkit.synth import DEFAULT_TRUTH, synth_logs

    try:
        run_id = synth_logs(
            db,
            run,
            nodes=nodes,
            prefill_iters=iterations,
            decode_iters=iterations,
            noise=noise,
            seed=seed,
        )
    except (ValueError, duckdb.Error) as exc:
        _fail(str(exc))
        return
    if as_json:
        info = {
            "run_id": run_id,
            "db": str(db),
            "nodes": nodes,
            "prefill_iterations": nodes * iterations,
            "decode_iterations": nodes * iterations,
            "truth": {k: list(v) if isinstance(v, tuple) else v for k, v in DEFAULT_TRUTH.items()},
        }
        typer.echo(json.dumps(info))
    else:
        typer.echo(
            f"wrote run {run_id} ({nodes} nodes x {iterations} prefill + {iterations} decode iterations) to {db}"
        )
