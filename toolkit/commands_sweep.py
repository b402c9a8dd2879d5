"""`pdlab sweep`: grid or random policy sweeps on local processes or Ray (paper 003 §5.2).

    pdlab sweep --preset table1 --db sweeps.duckdb
    pdlab sweep --base workload=cc --base nodes=1 --base split=collocated \\
        --base host_kv=false --base l1_tokens=150000 --base duration_s=600 --base warmup_s=0 \\
        --grid retention=lru,ttl,pressure-ttl --grid scheduling=fcfs,plas --seeds 0,1 \\
        --backend ray
    pdlab sweep ... --random retention_params.tau_s=loguniform:0.5:30 --samples 16

Values are JSON where they parse as JSON (numbers, true/false, null), strings otherwise.
Also `policy_options`, the `--retention/--scheduling/--dispatch/--policy-param` parsing
shared with `pdlab simulate`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cluster.core import ConfigError

console = Console(stderr=True)
FAMILIES = ("retention", "scheduling", "dispatch")


def parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _pairs(items: list[str], what: str) -> list[tuple[str, str]]:
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{what} {item!r} must look like KEY=VALUE")
        out.append((key.strip(), value))
    return out


def policy_options(
    retention: str | None, scheduling: str, dispatch: str | None, params: list[str]
) -> dict[str, Any]:
    """SimConfig fields for the planes from CLI options (FAMILY.KEY=VALUE parameters)."""
    out: dict[str, Any] = {"retention": retention, "scheduling": scheduling, "dispatch": dispatch}
    for key, value in _pairs(params, "--policy-param"):
        family, _, name = key.partition(".")
        if family not in FAMILIES or not name:
            raise ConfigError(
                f"--policy-param {key!r} must be FAMILY.KEY=VALUE with FAMILY one of "
                f"{', '.join(FAMILIES)}"
            )
        out.setdefault(f"{family}_params", {})[name] = parse_value(value)
    return out


def _random_dist(text: str) -> tuple[Any, ...]:
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


def build_spec(
    preset: str | None,
    quick: bool,
    base: list[str],
    grid: list[str],
    random: list[str],
    samples: int,
    seeds: str | None,
) -> Any:
    from cluster.sweep import SweepSpec
    from cluster.sweep import preset as make_preset

    if preset is not None:
        spec = make_preset(preset, quick)
        b, g, r = dict(spec.base), dict(spec.grid), dict(spec.random)
        name = spec.name
    else:
        b, g, r, name = {}, {}, {}, "sweep"
    for key, value in _pairs(base, "--base"):
        b[key] = parse_value(value)
    for key, value in _pairs(grid, "--grid"):
        g[key] = [parse_value(v) for v in value.split(",")]
    for key, value in _pairs(random, "--random"):
        r[key] = _random_dist(value)
    seed_tuple = (
        tuple(int(s) for s in seeds.split(","))
        if seeds
        else (spec.seeds if preset is not None else (0,))
    )
    out = SweepSpec(
        base=b, grid=g, random=r, samples=samples or (1 if r else 0), seeds=seed_tuple, name=name
    )
    out.validate()
    return out


def sweep_command(
    preset: str | None = typer.Option(None, help="table1 | policies | smoke"),
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
) -> None:
    """Sweep policies and parameters; results into DuckDB and a summary table."""
    from cluster.sweep import aggregate, expand, run_sweep, write_results

    try:
        spec = build_spec(preset, quick, base, grid, random, samples, seeds)
        total = len(expand(spec))
        with Progress(
            TextColumn(f"[bold]sweep {spec.name}[/] ({backend})"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} runs"),
            TimeElapsedColumn(),
            console=console,
            transient=as_json,
        ) as bar:
            task = bar.add_task("runs", total=total)
            rows = run_sweep(
                spec,
                backend,
                processes,
                on_row=lambda _r: bar.advance(task),
                ray_address=ray_address,
            )
    except ConfigError as err:
        console.print(f"[red]error:[/] {err}")
        raise typer.Exit(2) from None
    sid = write_results(db, rows, sweep_id) if db is not None else sweep_id
    agg = aggregate(rows)
    result: dict[str, Any] = {"sweep_id": sid, "name": spec.name, "aggregate": agg}
    if spec.name == "table1":
        from cluster.policies.experiments import table1_rows

        result["table1"] = table1_rows(agg)
    if as_json:
        from toolkit.commands_sim import _clean

        typer.echo(json.dumps(_clean(result | {"rows": rows}), default=str))
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
