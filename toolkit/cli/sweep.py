"""`pdlab sweep`: grid or random policy sweeps on local processes or Ray (paper 003 §5.2).

    pdlab sweep --preset smoke                      # 24 short runs: a first try (seconds)
    pdlab sweep --preset table1 --db sweeps.duckdb
    pdlab sweep --base workload=cc --base nodes=1 --base split=collocated \\
        --base host_kv=false --base l1_tokens=150000 --base duration_s=600 --base warmup_s=0 \\
        --grid retention=lru,ttl,pressure-ttl --grid scheduling=fcfs,plas --seeds 0,1 \\
        --backend ray
    pdlab sweep ... --random retention_params.tau_s=loguniform:0.5:30 --samples 16
    pdlab sweep --preset smoke --plot sweep.html    # + each point over seeds, 95% intervals

Values are JSON where they parse as JSON (numbers, true/false, null), strings otherwise.
A sweep needs something to run: a --preset, or axes and a base (--grid, --random, --base);
without any the command refuses instead of running SimConfig's default hour-long cluster.
Presets come from `cluster.experiments.policy_sweeps`. Every point's configuration is
checked before the progress bar and the workers start. A point that sets `duration_s` but no
`warmup_s` gets a warmup of a sixth of its duration, at most 600 s (of the trace's span when
it replays a trace at its arrival times, which it does once unless `trace_cycle=true`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cluster.core import ConfigError

if TYPE_CHECKING:
    from cluster.sweep import SweepSpec

console = Console(stderr=True)
NOTHING_TO_SWEEP = (
    "nothing to sweep: give --preset NAME (smoke: 24 short runs; table1; policies) or axes "
    "and a base configuration with --grid AXIS=V1,V2,..., --random AXIS=DIST and "
    "--base KEY=VALUE (see pdlab sweep --help)"
)


def _random_dist(text: str) -> tuple[Any, ...]:
    from toolkit.cli.sim_options import parse_value

    kind, _, rest = text.partition(":")
    if kind == "choice":
        return ("choice", [parse_value(v) for v in rest.split(",")])
    lo, _, hi = rest.partition(":")
    try:
        return (kind, float(lo), float(hi)) if kind != "int" else (kind, int(lo), int(hi))
    except ValueError:
        raise ConfigError(
            f"--random distribution {text!r}: use uniform:LO:HI, loguniform:LO:HI, int:LO:HI "
            "or choice:A,B,..."
        ) from None


def _seeds(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in text.split(","))
    except ValueError:
        raise ConfigError(
            f"--seeds {text!r} must be comma-separated integers, e.g. 0,1,2"
        ) from None


def build_spec(
    preset: str | None,
    quick: bool,
    base: list[str],
    grid: list[str],
    random: list[str],
    samples: int,
    seeds: str | None,
) -> SweepSpec:
    """The sweep the options describe (validated); ConfigError when they describe none."""
    from cluster.experiments.policy_sweeps import preset as make_preset
    from cluster.sweep import SweepSpec
    from toolkit.cli.sim_options import key_values, parse_value

    if preset is None and not (base or grid or random):
        raise ConfigError(NOTHING_TO_SWEEP)
    if preset is not None:
        spec = make_preset(preset, quick)
        b, g, r = dict(spec.base), dict(spec.grid), dict(spec.random)
        name, preset_seeds = spec.name, spec.seeds
    else:
        b, g, r, name, preset_seeds = {}, {}, {}, "sweep", (0,)
    for key, value in key_values(base, "--base"):
        b[key] = parse_value(value)
    for key, value in key_values(grid, "--grid"):
        g[key] = [parse_value(v) for v in value.split(",")]
    for key, value in key_values(random, "--random"):
        r[key] = _random_dist(value)
    out = SweepSpec(
        base=b,
        grid=g,
        random=r,
        samples=samples or (1 if r else 0),
        seeds=_seeds(seeds) if seeds else preset_seeds,
        name=name,
    )
    out.validate()
    return out


def sweep_command(
    preset: str | None = typer.Option(
        None, help="table1 | policies | smoke (24 short runs, seconds: a first try)"
    ),
    quick: bool = typer.Option(False, help="Fewer seeds for the presets"),
    base: list[str] = typer.Option([], "--base", help="SimConfig field KEY=VALUE (repeatable)"),
    grid: list[str] = typer.Option([], "--grid", help="Grid axis AXIS=V1,V2,... (repeatable)"),
    random: list[str] = typer.Option(
        [],
        "--random",
        help="Random axis AXIS=uniform:LO:HI | loguniform:LO:HI | int:LO:HI | choice:A,B",
    ),
    samples: int = typer.Option(0, help="Random draws per grid point"),
    seeds: str | None = typer.Option(None, help="Comma-separated seeds (replicates)"),
    backend: str = typer.Option("local", help="local | ray"),
    processes: int | None = typer.Option(None, help="Worker processes (local) or CPUs (ray)"),
    ray_address: str | None = typer.Option(None, help="Ray cluster address (default: local)"),
    db: Path | None = typer.Option(None, help="DuckDB file for the sweep_results table"),
    sweep_id: str | None = typer.Option(None, help="Sweep id (default: generated)"),
    as_json: bool = typer.Option(False, "--json", help="Print rows and aggregates as JSON"),
    plot: Path | None = typer.Option(
        None,
        "--plot",
        help="Write an HTML figure of each point's metric over seeds with 95% intervals",
    ),
    plot_metric: str = typer.Option(
        "mean_jct_s", "--plot-metric", help="Metric of --plot (a sweep_results column)"
    ),
) -> None:
    """Sweep policies and parameters; results into DuckDB and a summary table."""
    # Heavy imports inside the command, so `pdlab --help` stays fast.
    from cluster import size_limits
    from cluster.experiments.policy_sweeps import table1_rows
    from cluster.sweep import (
        BACKENDS,
        METRICS,
        aggregate,
        check_points,
        expand,
        run_points,
        write_results,
    )
    from toolkit.cli.sim_options import clean_json

    try:
        spec = build_spec(preset, quick, base, grid, random, samples, seeds)
        if backend not in BACKENDS:
            raise ConfigError(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        if plot is not None and plot_metric not in METRICS:
            raise ConfigError(
                f"--plot-metric must be one of {', '.join(METRICS)}, got {plot_metric!r}"
            )
        if plot is not None and not plot.parent.is_dir():
            raise ConfigError(f"--plot: folder {str(plot.parent)!r} does not exist")
        size_limits.check("--processes", processes, size_limits.PROCESSES)
        points = expand(spec)
        check_points(points)  # every configuration, before the bar and the workers start
        with Progress(
            TextColumn(f"[bold]sweep {spec.name}[/] ({backend})"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} runs"),
            TimeElapsedColumn(),
            console=console,
            transient=as_json,
        ) as bar:
            task = bar.add_task("runs", total=len(points))
            rows = run_points(
                points,
                backend,
                processes,
                on_row=lambda _r: bar.advance(task),
                ray_address=ray_address,
            )
    except ConfigError as err:
        console.print(f"[red]error:[/] {escape(str(err))}")
        raise typer.Exit(2) from None
    sid = write_results(db, rows, sweep_id) if db is not None else sweep_id
    if plot is not None:
        from toolkit.plots.seeds import metric_label, sweep_intervals

        title = f"sweep {spec.name}: {metric_label(plot_metric)} by point over seeds"
        fig = sweep_intervals(rows, plot_metric, title=title)
        fig.write_html(plot, include_plotlyjs=True)
        console.print(
            f"wrote {plot}: {plot_metric} of {len(points)} runs, 95% intervals over seeds"
        )
    agg = aggregate(rows)
    result: dict[str, Any] = {"sweep_id": sid, "name": spec.name, "aggregate": agg}
    if spec.name == "table1":
        result["table1"] = table1_rows(agg)
    if as_json:
        typer.echo(json.dumps(clean_json(result | {"rows": rows}), default=str))
        return
    _print(result, db)


def _fmt(v: Any, pct: bool = False) -> str:
    if v is None:
        return "-"
    if pct:
        return f"{100 * v:+.1f}%"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _print(result: dict[str, Any], db: Path | None) -> None:
    agg = result["aggregate"]
    axes = list(agg[0]["params"]) if agg else []
    t = Table(title=f"sweep {result['name']}" + (f" -> {db} ({result['sweep_id']})" if db else ""))
    for c in (*axes, "seeds", "mean JCT s", "vs point 0", "p99 JCT s", "preempt", "queue s", "hit"):
        t.add_column(c)
    for a in agg:
        t.add_row(
            *[_fmt(a["params"][x]) for x in axes],
            str(a["seeds"]),
            _fmt(a["mean_jct_s"]),
            _fmt(a["delta_jct"], pct=True),
            _fmt(a["p99_jct_s"]),
            _fmt(a["preemptions"]),
            _fmt(a["mean_queueing_s"]),
            _fmt(a["kv_hit_rate"]),
        )
    Console().print(t)
    if "table1" in result:
        t1 = Table(title="Table 1 shape: mean JCT change vs LRU + FCFS (paired SEM over seeds)")
        for c in ("retention", "FCFS", "PLAS"):
            t1.add_column(c)
        for row in result["table1"]:
            t1.add_row(
                row["retention"],
                *[
                    f"{_fmt(row.get(f'{s}_delta'), pct=True)} ± {_fmt(row.get(f'{s}_delta_sem'), pct=True).lstrip('+')}"
                    for s in ("fcfs", "plas")
                ],
            )
        Console().print(t1)
