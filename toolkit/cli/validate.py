"""`pdlab validate DB [--run NAME ...] [--profile RUN=PROFILE.json ...] [--json]` (issue 22).

Every imported real run of DB (or the `--run`s) replays on the twin and is compared with
what was measured (toolkit.validate.run.validate_runs): per metric the real value, the twin's,
the error, its 95% interval (request resampling or tick resolution combined with the
model's error; `--interval-replays` draws of the profiles' measurement error), whether it
contains 0 (per-tick rows: whether the real series lies in the twin's per-tick band on at
least 95% of the ticks), and each peer simulator's error on the same metric. Benchmark runs (`pdlab import vllm-bench`) need the operator
profile they replay with (`--profile RUN=PROFILE.json`); cluster runs (`pdlab import
lss-run`) carry theirs. `--json` prints {"rows": [...], "skipped": [...], "notes": {...}}.

`pdlab validate silicon [CSV] [--aic-systems DIR] [--model-configs DIR] [--no-aic]
[--cpu-overhead X] [--db DB --figure F.html]` shares the name (issue 23): the twin and AIConfigurator's estimator on
real deployments (toolkit.cli.validate_silicon). Exit code 2 for bad input.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import typer

EXIT_INPUT = 2
SILICON = "silicon"


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(EXIT_INPUT)


def _profiles(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        run, sep, path = item.partition("=")
        if not sep or not run or not path:
            _fail(f"--profile {item!r}: expected RUN=PROFILE.json")
        if not Path(path).is_file():
            _fail(f"--profile {item!r}: {path} is not a file")
        out[run] = path
    return out


def _fmt(x: float | None, kind: str, *, signed: bool = True) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    if kind == "points":
        return f"{x:.2f} pt"
    return f"{100 * x:+.1f}%" if signed and kind == "relative" else f"{100 * x:.1f}%"


def _value(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:.4g}" if abs(x) < 100 else f"{x:,.0f}"


def _covered(r: Any) -> str:
    if not r.known:
        return "not known"
    word = "yes" if r.covered else "no"
    if r.ticks_covered is not None:
        return f"{word} ({100 * r.ticks_covered:.0f}% of ticks)"
    return word


def summary(rows: list[Any]) -> str:
    """Relative rows covered of all, not known, median half-width; per-tick rows covered."""
    rel = [r for r in rows if r.kind == "relative"]
    known = [r.half_width for r in rel if r.known and r.half_width is not None]
    tick = [r for r in rows if r.kind != "relative"]
    med = f"{100 * statistics.median(known):.1f}%" if known else "-"
    return (
        f"relative rows: {sum(r.covered for r in rel)} of {len(rel)} covered "
        f"({sum(not r.known for r in rel)} not known), median half-width {med}; per-tick rows: "
        f"{sum(r.covered for r in tick)} of {len(tick)} with the real series in the twin's band "
        "on >= 95% of ticks"
    )


def print_table(table: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    peers = sorted({p for r in table.rows for p in r.peers})
    t = Table(
        title="validation: real runs vs the twin",
        caption="error: twin/real - 1 (relative), or the per-tick error itself (fraction, "
        "points); 95% interval of the error: its own spread and the model's error combined; "
        "covered: it contains 0 (per-tick rows: the real series lies in the twin's per-tick "
        "95% band on >= 95% of the ticks)",
    )
    cols = ("run", "metric", "real", "twin", "error", "95% interval", "covered", "half-width")
    for col in (*cols, *peers):
        t.add_column(col, justify="left" if col in ("run", "metric") else "right")
    for r in table.rows:
        lo, hi = r.ci95
        ci = (
            f"[{_fmt(lo, r.kind)}, {_fmt(hi, r.kind)}]"
            if r.known or r.kind != "relative"
            else "not known"
        )
        half = "-" if r.half_width is None else f"{100 * r.half_width:.1f}%"
        t.add_row(
            r.run, r.metric, _value(r.real), _value(r.twin), _fmt(r.error, r.kind), ci,
            _covered(r), half, *(_fmt(r.peers.get(p), r.kind) for p in peers),
        )  # fmt: skip
    console = Console()
    console.print(t)
    console.print(summary(table.rows))
    for run, why in table.skipped:
        console.print(f"[yellow]skipped {run}: {why}[/yellow]")
    lists = [set(n) for n in table.notes.values() if n]
    common = set.intersection(*lists) if len(lists) > 1 else set()
    for n in sorted(common):
        console.print(f"[dim]every run: {n}[/dim]")
    for run, notes in table.notes.items():
        own = [n for n in notes if n not in common]
        if own:
            console.print(f"[dim]{run}: {'; '.join(own)}[/dim]")


def validate_command(
    target: str = typer.Argument(
        ..., help="DuckDB database with imported real runs, or `silicon` (real deployments)."
    ),
    extra: list[str] | None = typer.Argument(
        None, help="`silicon` only: the CSV (default: aiconfigurator-core's silicon_sample.csv)."
    ),
    run: list[str] = typer.Option([], "--run", help="Validate only this run (repeatable)."),
    profile: list[str] = typer.Option(
        [], "--profile", help="RUN=PROFILE.json: the operator profile a benchmark run replays with."
    ),
    samples: int = typer.Option(1000, "--samples", min=50, help="Bootstrap resamples."),
    seed: int = typer.Option(0, "--seed", help="Bootstrap seed."),
    interval_replays: int = typer.Option(
        4, "--interval-replays", min=2, help="Replays on draws of the profiles' measurement error."
    ),
    aic_systems: Path | None = typer.Option(
        None,
        "--aic-systems",
        help="`silicon`: AIConfigurator systems/ directory (default: installed).",
    ),
    model_configs: list[Path] = typer.Option(
        [], "--model-configs", help="`silicon`: directory of HF config.json files (repeatable)."
    ),
    use_aic: bool = typer.Option(
        True,
        "--aic/--no-aic",
        help="`silicon`: also run AIConfigurator's estimator (if installed).",
    ),
    silicon_db: Path | None = typer.Option(
        None, "--db", help="`silicon`: store the run in this DuckDB file."
    ),
    figure: Path | None = typer.Option(
        None, "--figure", help="`silicon`: write the figure (HTML) here (needs --db)."
    ),
    cpu_overhead: float = typer.Option(
        0.0,
        "--cpu-overhead",
        min=0.0,
        help="`silicon`: CPU per iteration, x vidur's A100 vLLM schedule + prepare_inputs "
        "(0.189 ms + 3.68 us/seq; an assumption, 0 = kernels only).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Replay every imported real run on the twin and compare: one validation table.

    `pdlab validate silicon [CSV]`: the twin and AIConfigurator on real deployments."""
    if target == SILICON:
        if extra and len(extra) > 1:
            _fail(f"`validate silicon` takes one CSV, got {len(extra)}: {' '.join(extra)}")
        from toolkit.cli.validate_silicon import run_silicon

        run_silicon(
            Path(extra[0]) if extra else None, aic_systems=aic_systems,
            model_configs=model_configs, use_aic=use_aic, db=silicon_db, figure=figure,
            as_json=as_json, cpu_overhead=cpu_overhead,
        )  # fmt: skip
        return
    if (
        silicon_db is not None or figure is not None or aic_systems is not None or model_configs
        or cpu_overhead
    ):  # fmt: skip
        _fail(
            "--db, --figure, --aic-systems, --model-configs and --cpu-overhead belong to "
            "`validate silicon`"
        )
    if extra:
        _fail(
            f"unexpected argument(s) {' '.join(extra)} after the database (options start with --)"
        )
    from cluster.core import ConfigError
    from telemetry import TelemetryError
    from toolkit.validate.run import validate_runs

    db = Path(target)
    if not db.exists():
        _fail(f"{db}: no such database (or `pdlab validate silicon [CSV]` for real deployments)")
    try:
        table = validate_runs(
            db, run or None, _profiles(profile), samples=samples, seed=seed,
            profile_replays=interval_replays,
        )  # fmt: skip
    except (ConfigError, TelemetryError, FileNotFoundError) as exc:
        _fail(str(exc))
        return
    if as_json:
        typer.echo(json.dumps(table.to_json()))
        return
    print_table(table)
