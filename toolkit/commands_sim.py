"""`pdlab simulate`: simulate agent workloads on a PD-disaggregated cluster (SPEC §5, §7)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from cluster.core import ConfigError

console = Console(stderr=True)


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_clean(x) for x in v]
    return v


def simulate_command(
    workload: str = typer.Option("cc", help="putnam | cc | osworld | shift | path to a trace file"),
    nodes: int = typer.Option(9, help="Number of nodes (each 4 GPUs in the presets)"),
    split: str = typer.Option("4P5D", help="Initial split XPYD, or 'collocated'"),
    agents: int | None = typer.Option(
        None, help="Closed loop: concurrent agents (default 126 unless --arrival-rate)"
    ),
    arrival_rate: float | None = typer.Option(
        None, "--arrival-rate", help="Open loop: Poisson agent arrivals per minute"
    ),
    max_active: int = typer.Option(258, help="Open loop admission limit (concurrent agents)"),
    duration: float = typer.Option(3600.0, help="Simulated seconds"),
    warmup: float = typer.Option(
        600.0,
        help="Warmup seconds excluded from metrics (the gain planner serves collocated and "
        "fits during the first --learn of them)",
    ),
    learn: float | None = typer.Option(
        None,
        help="Seconds of collocated learning before disaggregation (Alg. E.3 T_learn; "
        "default: the whole warmup)",
    ),
    planner: str = typer.Option("gain", help="gain | static | dynamo | arrow"),
    router: str = typer.Option(
        "ttft", help="ttft | cache-aware | dynamo | sticky | round-robin | least-loaded"
    ),
    eviction: str = typer.Option("branch", help="branch | lru"),
    profile: str = typer.Option(
        "gb300", help="Preset (gb300, h200) or path to a `pdlab fit --json` file"
    ),
    seed: int = typer.Option(0, help="Random seed"),
    db: Path | None = typer.Option(None, help="DuckDB file for the run's telemetry"),
    run_id: str | None = typer.Option(None, "--run-id", help="Run id (default: generated)"),
    kv_fetch: str | None = typer.Option(
        None, help="async | sync | none (default: async for ttft, none otherwise)"
    ),
    telemetry: str = typer.Option(
        "full", help="full | compact (compact drops kv_events, branch_counts, router_decisions)"
    ),
    relaunch: float = typer.Option(
        700.0, help="Seconds a Dynamo-like relaunch keeps a node out of service"
    ),
    retention: str | None = typer.Option(
        None,
        help="Retention policy (paper 003): evict-always | lru | ttl | per-tool-ttl | "
        "pressure-ttl | min-waste | branch-count | path.py[:Class] | pkg.module:Class",
    ),
    scheduling: str = typer.Option(
        "fcfs", help="Scheduling priority: fcfs | program-fcfs | plas | path.py[:Class]"
    ),
    dispatch: str | None = typer.Option(
        None,
        help="Program routing instead of --router: round-robin | least-loaded | "
        "session-affinity | path.py[:Class]",
    ),
    policy_param: list[str] = typer.Option(
        [], "--policy-param", help="FAMILY.KEY=VALUE for a policy, e.g. retention.tau_s=5"
    ),
    host_kv: bool = typer.Option(
        True, "--host-kv/--no-host-kv", help="--no-host-kv: one GPU KV pool (collocated only)"
    ),
    l1_tokens: int | None = typer.Option(None, help="GPU KV tokens per node (profile default)"),
    l2_tokens: int | None = typer.Option(None, help="Host KV tokens per node (profile default)"),
    max_programs: int | None = typer.Option(None, help="Admit at most this many programs"),
    partitions: int = typer.Option(
        1, help="Hierarchical partitions (paper 000 App. D.2), simulated in parallel"
    ),
    processes: int | None = typer.Option(
        None, help="Worker processes for partitions (default: CPU count)"
    ),
    fit: bool = typer.Option(
        False, "--fit", help="Then fit each node's iteration-time models from the run (needs --db)"
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as one JSON object"),
) -> None:
    """Simulate a workload on the embedded cluster and print the run summary."""
    if fit and db is None:
        console.print(
            "[red]error:[/] --fit needs --db (the models are fitted from the stored iteration logs)"
        )
        raise typer.Exit(2)
    from cluster.core import tune_gc
    from cluster.sim.runner import simulate
    from cluster.sim.simulator import SimConfig
    from toolkit.commands_sweep import policy_options

    tune_gc()

    if agents is None and arrival_rate is None:
        agents = 126
    try:
        cfg = SimConfig(
            workload=workload,
            nodes=nodes,
            split=split,
            agents=agents,
            arrival_rate_per_min=arrival_rate,
            max_active=max_active,
            duration_s=duration,
            warmup_s=warmup,
            learn_s=learn,
            planner=planner,
            router=router,
            eviction=eviction,
            profile=profile,
            seed=seed,
            kv_fetch=kv_fetch,
            telemetry=telemetry,
            relaunch_s=relaunch,
            host_kv=host_kv,
            l1_tokens=l1_tokens,
            l2_tokens=l2_tokens,
            max_programs=max_programs,
            **policy_options(retention, scheduling, dispatch, policy_param),
        )
        with Progress(
            TextColumn("[bold]simulating[/] {task.description}"),
            BarColumn(),
            TextColumn("{task.completed:.0f}/{task.total:.0f} sim-s"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=as_json,
        ) as bar:
            if partitions > 1:
                from cluster.sim.partitions import simulate_partitioned

                task = bar.add_task(
                    f"{workload}: {partitions} partitions of {nodes // max(partitions, 1)} nodes",
                    total=partitions,
                )
                summary = simulate_partitioned(
                    cfg,
                    partitions,
                    db,
                    run_id,
                    processes=processes,
                    on_done=lambda _r: bar.advance(task),
                )
            else:
                task = bar.add_task(f"{workload} on {nodes} nodes", total=duration)
                summary = simulate(
                    cfg, db, run_id, progress=lambda t: bar.update(task, completed=t)
                )
    except (ConfigError, ValueError) as err:
        console.print(f"[red]error:[/] {err}")
        raise typer.Exit(2) from None
    summary = _clean(summary)
    fits = None
    if fit and db is not None:
        from toolkit.commands_fit import _print_table
        from toolkit.fitting import fit_run, save_fits, to_json

        runs = summary.get("partition_runs") or [summary["run_id"]]
        fits = [(fit_run(db, r), r) for r in runs]
        for result, _ in fits:
            save_fits(db, result)
    if as_json:
        if fits is not None:
            summary["fits"] = [to_json(f) for f, _ in fits]
        typer.echo(json.dumps(summary))
        return
    table = Table(title=f"run {summary.get('run_id') or '(not stored)'}", show_header=False)
    for key in (
        "workload", "partitions", "initial_split", "final_split", "planner", "router", "eviction", "sim_seconds",
        "wall_seconds", "speedup", "requests", "throughput_rps", "mean_ttft_s", "p95_ttft_s",
        "mean_e2e_s", "p50_e2e_s", "p95_e2e_s", "kv_hit_rate", "ideal_kv_hit_rate",
        "lost_kv_reuse", "switches", "mean_switch_time_s", "retention", "scheduling",
        "mean_jct_s", "p99_jct_s", "preemptions", "mean_tpot_s", "mean_queueing_s",
    ):  # fmt: skip
        v = summary.get(key)
        if v is None:
            continue  # not applicable to this run (no partitions, no finished program, ...)
        table.add_row(key, f"{v:.4g}" if isinstance(v, float) else str(v))
    Console().print(table)
    for result, _ in fits or ():
        _print_table(result, None)


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
    from cluster.sim.experiments import configs, run_experiment

    tune_gc()
    try:
        total = len(configs(name, quick))
    except ConfigError as err:
        console.print(f"[red]error:[/] {err}")
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
    result = _clean(result)
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
