"""`pdlab simulate` and `pdlab experiment`: simulate agent workloads on a PD-disaggregated
cluster (SPEC §5, §7) and reproduce paper 000's qualitative results.

`simulate`'s simulation options are SimConfig's fields (their flags, help and defaults
declared beside each field, built into typer options by `toolkit.cli.sim_command`); it turns
them into a SimConfig through `toolkit.cli.sim_options` (shared with `sweep` and `serve`),
checks it before the progress bar starts, and after the summary says where the telemetry went
and what to run on it next.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from cluster.core import ConfigError
from toolkit.cli.sim_command import sim_command

if TYPE_CHECKING:
    from cluster.sim.config import SimConfig
    from toolkit.cli.sim_options import SimOptions

console = Console(stderr=True)


def forms_line(forms: dict[str, str]) -> str:
    """'prefill: paper (0, 1); decode: ctx (0), paper (1)' from node.phase -> form."""
    parts = []
    for phase in ("prefill", "decode"):
        by: dict[str, list[str]] = {}
        for key, form in forms.items():
            node, _, ph = key.partition(".")
            if ph == phase:
                by.setdefault(form, []).append(node)
        parts.append(f"{phase}: " + ", ".join(f"{f} ({', '.join(n)})" for f, n in by.items()))
    return "; ".join(parts)


@sim_command()
def simulate_command(
    sim: SimOptions,  # one option per SimConfig field with a flag (toolkit/cli/sim_command.py)
    db: Path | None = typer.Option(None, help="DuckDB file for the run's telemetry"),
    run_id: str | None = typer.Option(None, "--run-id", help="Run id (default: generated)"),
    partitions: int = typer.Option(
        1, help="Hierarchical partitions (paper 000 App. D.2), simulated in parallel"
    ),
    processes: int | None = typer.Option(
        None,
        help="Worker processes (local) or CPUs of the local Ray runtime (ray) for "
        "partitions (default: one per partition, at most the CPU count)",
    ),
    backend: str = typer.Option(
        "local", help="Where partitions run: local (processes) | ray (tasks; needs pdlab[ray])"
    ),
    address: str | None = typer.Option(
        None,
        "--address",
        "--ray-address",
        help="Ray cluster to run partitions on, e.g. ray://head:10001 or auto (default: a "
        "local Ray runtime, shut down after the run)",
    ),
    fit: bool = typer.Option(
        False, "--fit", help="Then fit each node's iteration-time models from the run (needs --db)"
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as one JSON object"),
) -> None:
    """Simulate a workload on the embedded cluster and print the run summary."""
    _check_run_options(fit, db, backend, address)
    # Heavy imports inside the command, so `pdlab --help` stays fast.
    from cluster import size_limits
    from cluster.core import leave_garbage_to_os, tune_gc
    from toolkit.cli.sim_options import clean_json

    tune_gc()
    try:
        cfg = sim.to_config()  # checked: a bad option fails before the progress bar
        size_limits.PARTITIONS.check("--partitions", partitions)
        size_limits.check("--processes", processes, size_limits.PROCESSES)
    except ConfigError as err:
        console.print(f"[red]error:[/] {escape(str(err))}")
        raise typer.Exit(2) from None
    try:
        summary = _simulate(cfg, db, run_id, partitions, processes, backend, address, as_json)
    except (ConfigError, ValueError) as err:
        console.print(f"[red]error:[/] {escape(str(err))}")
        raise typer.Exit(2) from None
    leave_garbage_to_os()  # the run is stored and its database closed
    summary = clean_json(summary)
    fits = None
    if fit and db is not None:
        from toolkit.fit.run import fit_run, save_fits

        runs = summary.get("partition_runs") or [summary["run_id"]]
        fits = [fit_run(db, r) for r in runs]
        for result in fits:
            save_fits(db, result)
    if as_json:
        from toolkit.fit.run import to_json

        if fits is not None:
            summary["fits"] = [to_json(f) for f in fits]
        typer.echo(json.dumps(summary))
        return
    _print_summary(summary, agents_given=sim.get("agents") is not None)
    if fits is not None:
        from toolkit.cli.fit import _print_table

        for result in fits:
            _print_table(result, None)
    runs = summary.get("partition_runs") or ([summary["run_id"]] if summary.get("run_id") else [])
    _print_next_steps(db, runs, fitted=fits is not None)


def _check_run_options(fit: bool, db: Path | None, backend: str, address: str | None) -> None:
    """What can fail before the simulation starts: --fit without --db, an unusable --db, a
    backend that is unknown or not installed (one line each, exit code 2)."""
    if fit and db is None:
        console.print(
            "[red]error:[/] --fit needs --db (the models are fitted from the stored iteration logs)"
        )
        raise typer.Exit(2)
    if db is not None:
        from telemetry import TelemetryError
        from telemetry.database import check_database

        try:
            check_database(db)
        except TelemetryError as err:
            console.print(f"[red]error:[/] --db: {err}")
            raise typer.Exit(2) from None
    if backend not in ("local", "ray"):
        console.print(f"[red]error:[/] --backend must be one of local, ray, got {backend!r}")
        raise typer.Exit(2)
    if address is not None and backend != "ray":
        console.print("[red]error:[/] --address needs --backend ray")
        raise typer.Exit(2)
    if backend == "ray":
        from cluster.sim.ray_runtime import import_ray

        try:
            import_ray()  # a missing extra fails here, not after the progress bar started
        except ConfigError as err:
            console.print(f"[red]error:[/] {escape(str(err))}")
            raise typer.Exit(2) from None


def _simulate(
    cfg: SimConfig,
    db: Path | None,
    run_id: str | None,
    partitions: int,
    processes: int | None,
    backend: str,
    address: str | None,
    as_json: bool,
) -> dict[str, Any]:
    """The run (partitioned when asked), behind a progress bar of simulated seconds."""
    from cluster.sim.runner import simulate

    with Progress(
        TextColumn("[bold]simulating[/] {task.description}"),
        BarColumn(),
        TextColumn("{task.completed:.0f}/{task.total:.0f} sim-s"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=as_json,
    ) as bar:
        if partitions > 1 or backend == "ray":
            from cluster.sim.partitions import simulate_partitioned

            task = bar.add_task(
                f"{cfg.workload}: {partitions} partitions of "
                f"{cfg.nodes // max(partitions, 1)} nodes",
                total=partitions,
            )
            return simulate_partitioned(
                cfg,
                partitions,
                db,
                run_id,
                processes=processes,
                backend=backend,
                on_done=lambda _r: bar.advance(task),
                ray_address=address,
            )
        task = bar.add_task(f"{cfg.workload} on {cfg.nodes} nodes", total=cfg.duration_s)
        return simulate(cfg, db, run_id, progress=lambda t: bar.update(task, completed=t))


def _print_summary(summary: dict[str, Any], *, agents_given: bool) -> None:
    """The run's summary as a table, and a line on a trace replay."""
    table = Table(title=f"run {summary.get('run_id') or '(not stored)'}", show_header=False)
    for key in (
        "workload", "partitions", "initial_split", "final_split", "planner", "router", "eviction", "sim_seconds",
        "wall_seconds", "speedup", "requests", "throughput_rps", "mean_ttft_s", "p95_ttft_s",
        "mean_e2e_s", "p50_e2e_s", "p95_e2e_s", "kv_hit_rate", "ideal_kv_hit_rate",
        "lost_kv_reuse", "switches", "mean_switch_time_s", "retention", "scheduling",
        "mean_jct_s", "p99_jct_s", "preemptions", "preemptions_total", "mean_tpot_s",
        "mean_queueing_s", "mean_decode_wait_s", "decode_refused",
    ):  # fmt: skip
        v = summary.get(key)
        if v is None:
            continue  # not applicable to this run (no partitions, no finished program, ...)
        table.add_row(key, f"{v:.4g}" if isinstance(v, float) else str(v))
    if summary.get("warmup_forms"):
        table.add_row("warmup_forms", forms_line(summary["warmup_forms"]))
    Console().print(table)
    note = trace_note(summary, agents_given=agents_given)
    if note:
        Console().print(note, soft_wrap=True, markup=False, highlight=False)


def trace_note(summary: dict[str, object], *, agents_given: bool = False) -> str | None:
    """One line on a trace replay: how much of the trace was served, and how."""
    replay = summary.get("trace_replay")
    if replay is None:
        return None
    total, served = summary.get("trace_requests"), summary.get("trace_requests_served")
    if replay == "arrivals":
        note = f"trace: {served} of {total} requests served, each once at its arrival time"
        if summary.get("trace_finished"):
            note += f"; the run ended when the last finished (t={summary['sim_seconds']:.1f} s)"
        else:
            note += f"; the run ended at --duration {summary['sim_seconds']:g} s"
        if agents_given:
            note += "; --agents does not apply (--cycle: the agents cycle the trace instead)"
        if summary.get("measured_seconds") == 0:
            note += "; nothing measured: the run ended within the --warmup"
        return note
    loop = "a closed loop of agents" if replay == "closed" else "open-loop arrivals"
    how = "cycling the trace" if summary.get("trace_cycled") else "each program at most once"
    return f"trace: {served} requests served from a {total}-request trace by {loop}, {how}"


def _print_next_steps(db: Path | None, runs: list[str], fitted: bool) -> None:
    """Where the run's telemetry went and the commands that read it."""
    out = Console()
    if db is None or not runs:
        out.print(
            "telemetry not stored: add --db FILE to keep it for `pdlab report`, `pdlab fit` "
            "and the notebooks"
        )
        return
    arg = shlex.quote(str(db))
    run = f" --run {shlex.quote(runs[0])}"
    what = f"run {runs[0]}" if len(runs) == 1 else f"runs {', '.join(runs)} (one per partition)"
    out.print(
        f"telemetry of {what} in {db.resolve()}", soft_wrap=True, markup=False, highlight=False
    )
    steps = [
        (f"pdlab report {arg}{run} -o report.html", "the run's summary and figures in one file"),
        (
            f"pdlab fit {arg}{run}",
            "refit with other options (--node, --holdout, --bootstrap)"
            if fitted
            else "fit each node's iteration-time models",
        ),
        (
            f"pdlab lab --db {arg}",
            "JupyterLab: notebooks 01/02 open this run, 04 a live cluster added to the DB",
        ),
    ]
    width = max(len(c) for c, _ in steps)
    out.print("next:", highlight=False)
    for command, note in steps:
        out.print(f"  {command:<{width}}  # {note}", soft_wrap=True, markup=False, highlight=False)


def experiment_command(
    name: str = typer.Argument(..., help="eviction | routing | splits | planner | shift"),
    quick: bool = typer.Option(
        False, help="Shorter runs (minutes instead of an hour of simulated time)"
    ),
    processes: int = typer.Option(2, help="Worker processes"),
    as_json: bool = typer.Option(False, "--json", help="Print rows and verdict as one JSON object"),
) -> None:
    """Reproduce one of paper 000's qualitative results on the simulator."""
    from cluster.core import tune_gc
    from cluster.experiments.evolving_infra import configs, run_experiment
    from toolkit.cli.sim_options import clean_json

    tune_gc()
    try:
        total = len(configs(name, quick))
    except ConfigError as err:
        console.print(f"[red]error:[/] {escape(str(err))}")
        raise typer.Exit(2) from None
    with Progress(
        TextColumn(f"[bold]{name}[/]"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} runs"),
        TimeElapsedColumn(),
        console=console,
        transient=as_json,
    ) as bar:
        task = bar.add_task(name, total=total)
        result = run_experiment(name, quick, processes, on_row=lambda _r: bar.advance(task))
    result = clean_json(result)
    if as_json:
        typer.echo(json.dumps(result))
        return
    table = Table(title=f"experiment {name}")
    cols = (
        "workload",
        "initial_split",
        "final_split",
        "planner",
        "router",
        "eviction",
        "kv_fetch",
        "throughput_rps",
        "mean_ttft_s",
        "p95_ttft_s",
        "mean_e2e_s",
        "lost_kv_reuse",
        "switches",
    )
    for c in cols:
        table.add_column(c)
    for r in result["rows"]:
        table.add_row(*[f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for c in cols])
    Console().print(table)
    Console().print_json(data=result["verdict"])
