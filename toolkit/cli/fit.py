"""`pdlab fit` and `pdlab synth-logs` (SPEC §7; paper 000 §5.1 iteration-time models).

`pdlab fit DB` fits Eq. 1 / Eq. 2 (or, with --form, the forms of models.forms chosen per
node and phase by cross-validation: toolkit.fit.forms) per node of one run, prints a rich
table or, with --json, exactly one JSON object on stdout, and stores the fits in
`model_fits`; a live PD cluster run's serving overheads per stage (toolkit.fit.overheads)
are printed and stored in `overhead_fits` too. A node whose data cannot determine a model gets a message in its entry and
the command still succeeds, unless no node and phase could be fitted at all (exit code 1);
a database that cannot be fitted (missing file or tables, a table that breaks the schema,
unknown run, several runs without --run) is a one-line error with exit code 2. A run that
never finished is fitted from its rows, with a warning on stderr.
Heavy imports happen inside the commands so `pdlab --help` stays fast.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from toolkit.cli.formatting import json_text, percent

EXIT_INPUT = 2
EXIT_NOTHING_FITTED = 1


def run_overheads(db: Path, run_id: str, write: bool) -> Any:
    """The run's serving overheads (empty unless it is a live PD cluster's, with request
    stages), stored in overhead_fits when `write`."""
    from models.overheads import ServingOverheads
    from toolkit.fit.overheads import fit_overheads, save_overheads
    from toolkit.fit.run import FitInputError

    try:
        _, overheads = fit_overheads(db, run_id)
        if write and overheads:
            save_overheads(db, run_id, overheads)
    except FitInputError:  # a database of another tool: the iteration fits alone
        return ServingOverheads()
    return overheads


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(EXIT_INPUT)


def _coef_cell(fit: Any, terms: tuple[str, ...]) -> str:
    """--wide: one line per coefficient with its CI; the entry's message (dim, or red)."""
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


def _compact_cell(fit: Any, notes: dict[str, int]) -> str:
    """The coefficients in one line (scientific notation); messages become numbered notes."""
    ref = ""
    if fit.message:
        key = fit.message.split(": ", 1)[1] if not fit.ok and ": " in fit.message else fit.message
        ref = f" [{notes.setdefault(key, len(notes) + 1)}]"
    if not fit.ok:
        return f"[red]not fitted[/red]{ref}"
    return " ".join(f"{v:.2e}" for v in fit.coef) + ref


def form_key(forms: Iterable[tuple[str, str]]) -> list[str]:
    """One line per (phase, form label) used: its coefficients in the order printed, written
    out (models.forms.Form.equation), so `c4`, `d3` or `m0` are never shown without a key."""
    from models.forms import form_by_label

    seen: dict[str, str] = {}
    for phase, form in forms:
        label = phase if form == "paper" else f"{phase} ({form})"
        if label not in seen:
            try:
                seen[label] = form_by_label(phase, form).equation  # type: ignore[arg-type]
            except ValueError:
                seen[label] = "(unknown form)"
    width = max((len(k) for k in seen), default=0)
    return [
        f"{'key:' if i == 0 else '':4} {label:<{width}}  {eq}"
        for i, (label, eq) in enumerate(seen.items())
    ]


def _print_table(result: Any, written: int | None, wide: bool = False) -> None:
    """The fits of a run: compact by default (one line per node and phase, readable at 80
    columns, notes numbered below the table); `wide` shows each coefficient with its CI."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from models.fitting import DECODE_TERMS, PREFILL_TERMS

    console = Console()
    if result.note:
        Console(stderr=True).print(f"[yellow]warning:[/yellow] {escape(result.note)}")
    if wide:
        caption = "coefficients in seconds with bootstrap 95% CIs; MAPE on held-out iterations"
        table = Table(
            title=f"iteration-time fits of run {result.run_id}", caption=caption, show_lines=True
        )
        table.add_column("node", justify="right")
        table.add_column("phase")
        table.add_column("coefficients", overflow="fold", min_width=36)
    else:
        table = Table(
            title=f"iteration-time fits of run {result.run_id}",
            caption="coefficients in seconds (key below); MAPE on held-out iterations; "
            "--wide adds 95% CIs",
            box=box.SIMPLE_HEAD,
            padding=(0, 1),
        )
        table.add_column("node", justify="right")
        table.add_column("phase")
        # wraps between coefficients when a chosen form adds terms (e.g. decode d3)
        table.add_column("coefficients (s)", overflow="fold", min_width=27)
    table.add_column("MAPE", justify="right")
    table.add_column("fit/test", justify="right")
    notes: dict[str, int] = {}
    for node in result.nodes:
        for fit, terms in ((node.prefill, PREFILL_TERMS), (node.decode, DECODE_TERMS)):
            mape = percent(fit.mape)
            samples = f"{fit.samples}/{fit.samples_test}"
            phase = fit.phase if fit.form == "paper" else f"{fit.phase} ({fit.form})"
            cell = _coef_cell(fit, tuple(fit.terms) or terms) if wide else _compact_cell(fit, notes)
            table.add_row(str(node.node_id), phase, cell, mape, samples)
    console.print(table)
    fits = [fit for node in result.nodes for fit in (node.prefill, node.decode) if fit.ok]
    for line in form_key((fit.phase, fit.form) for fit in fits):
        console.print(line, highlight=False)
    for text, number in notes.items():
        console.print(f"[{number}] {escape(text)}", highlight=False)
    if written is not None:
        console.print(f"{written} rows written to model_fits")


def _check_size(flag: str, value: object, limit: str) -> None:
    """A count against its ceiling (cluster.size_limits), as a one-line error."""
    from cluster import size_limits
    from cluster.core import ConfigError

    try:
        size_limits.LIMITS[limit].check(flag, value)
    except ConfigError as exc:
        _fail(str(exc))


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
    form: str = typer.Option(
        "paper",
        "--form",
        help="Model form: paper (Eq. 1/2), auto (chosen per node and phase by cross-validation), "
        "floor (prefill with a small-chunk floor), ctx (decode with a context term).",
    ),
    ci: str = typer.Option(
        "time",
        "--ci",
        help="Intervals: time (resample time windows: covers model error) or rows (row buckets: "
        "sampling noise only).",
    ),
    target: str = typer.Option(
        "auto",
        "--target",
        help="What the forms predict: wall (each pass's duration_s), cpu (the engine thread's "
        "CPU time of it, cpu_s: its work, without what a loaded host gave other processes), "
        "auto (cpu where every row of the phase has it, else wall).",
    ),
    write: bool = typer.Option(
        True, "--write/--no-write", help="Store the fits in model_fits (and overhead_fits)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
    wide: bool = typer.Option(
        False, "--wide", help="One line per coefficient with its 95% CI (needs ~120 columns)."
    ),
) -> None:
    """Fit prefill (Eq. 1) and decode (Eq. 2) iteration-time models per node of a run."""
    from toolkit.fit.forms import fit_run_forms
    from toolkit.fit.overheads import overheads_json, print_overheads
    from toolkit.fit.run import FitInputError, fit_run, save_fits, to_json

    if ci not in ("time", "rows"):
        _fail(f"--ci must be 'time' or 'rows', got {ci!r}")
    if target not in ("auto", "wall", "cpu"):
        _fail(f"--target must be auto, wall or cpu, got {target!r}")
    _check_size("--bootstrap", bootstrap, "BOOTSTRAP")
    try:
        if form == "paper" and ci == "rows" and target == "wall":
            result = fit_run(db, run, node, holdout=holdout, bootstrap=bootstrap, seed=seed)
        else:
            result = fit_run_forms(
                db,
                run,
                node,
                form=form,
                holdout=holdout,
                bootstrap=bootstrap,
                ci="rows" if ci == "rows" else "time",
                seed=seed,
                target=target,  # type: ignore[arg-type]
            )
        written = save_fits(db, result) if write else None
        overheads = run_overheads(db, result.run_id, write)
    except FitInputError as exc:
        _fail(str(exc))
        return
    if as_json:
        out = to_json(result)
        out["model_fits_written"] = written or 0
        out["overheads"] = overheads_json(overheads)
        if result.note:
            typer.echo(f"warning: {result.note}", err=True)
        typer.echo(json_text(out))
    else:
        _print_table(result, written, wide)
        print_overheads(overheads)
    if not any(f.ok for n in result.nodes for f in (n.prefill, n.decode)):
        typer.echo(f"error: no model could be fitted from run {result.run_id}", err=True)
        raise typer.Exit(EXIT_NOTHING_FITTED)


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

    from toolkit.fit.synth import DEFAULT_TRUTH, synth_logs

    _check_size("--nodes", nodes, "NODES")
    _check_size("--iterations", iterations, "SYNTH_ITERATIONS")

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
