"""`pdlab simulate` and `pdlab experiment`: simulate agent workloads on a PD-disaggregated
cluster (SPEC §5, §7) and reproduce paper 000's qualitative results.

`simulate` turns its options into a SimConfig through `toolkit.sim_options` (shared with
`sweep` and `serve`), checks it before the progress bar starts, and after the summary says
where the telemetry went and what to run on it next.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from cluster.core import ConfigError

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


def simulate_command(
    workload: str = typer.Option("cc", help="putnam | cc | osworld | shift | path to a trace file"),
    nodes: int = typer.Option(9, help="Number of nodes (each 4 GPUs in the presets)"),
    split: str = typer.Option("4P5D", help="Initial split XPYD, or 'collocated'"),
    agents: int | None = typer.Option(
        None,
        help="Closed loop: concurrent agents (default 126 unless --arrival-rate; a trace with "
        "arrival times replays them instead, unless --cycle)",
    ),
    arrival_rate: float | None = typer.Option(
        None, "--arrival-rate", help="Open loop: Poisson agent arrivals per minute"
    ),
    max_active: int = typer.Option(258, help="Open loop admission limit (concurrent agents)"),
    duration: float = typer.Option(3600.0, help="Simulated seconds"),
    warmup: float | None = typer.Option(
        None,
        help="Warmup seconds excluded from metrics (default: a sixth of --duration, at most "
        "600; the gain planner serves collocated and fits during the first --learn of them)",
    ),
    learn: float | None = typer.Option(
        None,
        help="Seconds of collocated learning and model fitting before disaggregation, within "
        "the warmup (Alg. E.3 T_learn; default: min(300, --warmup))",
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
    hook_budget: float | None = typer.Option(
        None,
        "--hook-budget",
        help="Wall seconds one user policy hook call may run before the run fails naming it "
        "(default 10; 0: no limit)",
    ),
    host_kv: bool = typer.Option(
        True, "--host-kv/--no-host-kv", help="--no-host-kv: one GPU KV pool per node, no host tier"
    ),
    l1_tokens: int | None = typer.Option(None, help="GPU KV tokens per node (profile default)"),
    l2_tokens: int | None = typer.Option(None, help="Host KV tokens per node (profile default)"),
    max_num_seqs: int | None = typer.Option(
        None,
        "--max-num-seqs",
        help="Engine limit: running sequences per node (decode batch cap, the rest queue; "
        "sequences per prefill iteration). Any engine limit makes decode KV grow as "
        "generated and preempts the newest decode when it runs out (vLLM)",
    ),
    max_num_batched_tokens: int | None = typer.Option(
        None,
        "--max-num-batched-tokens",
        help="Engine limit: token budget per iteration (prefill chunks; a collocated "
        "node's running decodes take theirs first) (default: the profile's chunk)",
    ),
    gpu_memory_gib: float | None = typer.Option(
        None,
        "--gpu-memory-gib",
        help="Engine limit: GPU memory per GPU; KV capacity per node = memory x "
        "utilization - weights - activations, from the profile's model (instead of "
        "--l1-tokens; needs a `pdlab profile import` profile)",
    ),
    gpu_memory_utilization: float | None = typer.Option(
        None,
        "--gpu-memory-utilization",
        help="Share of --gpu-memory-gib the engine may use, in (0, 1] (default 0.9)",
    ),
    form: str = typer.Option(
        "paper",
        "--form",
        help="Iteration-time forms the warmup fits and the planner and router price with: "
        "paper (Eq. 1/2), auto (chosen per node by cross-validation, as `pdlab fit --form "
        "auto`), floor, roofline, ctx",
    ),
    prefill_forms: bool = typer.Option(
        False,
        "--prefill-forms",
        help="The router prices each node's prefill with the profile's fitted form (its "
        "prefill floor and roofline terms: a `pdlab profile import` profile or a fit JSON) "
        "instead of Eq. 3 alone (a --form other than paper does too, with the forms the "
        "warmup chose)",
    ),
    max_programs: int | None = typer.Option(None, help="Admit at most this many programs"),
    cycle: bool = typer.Option(
        False,
        "--cycle",
        help="Trace: --agents agents (or --arrival-rate) cycle the trace's programs, ignoring "
        "arrival times (default: each program once, at its arrival time if it has one; the "
        "run ends when the last finishes)",
    ),
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
    # Heavy imports inside the command, so `pdlab --help` stays fast.
    from cluster import size_limits
    from cluster.core import leave_garbage_to_os, tune_gc
    from cluster.sim.runner import simulate
    from toolkit.sim_options import SimOptions, clean_json

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
    tune_gc()
    options = SimOptions(
        workload=workload,
        nodes=nodes,
        split=split,
        agents=agents,
        arrival_rate=arrival_rate,
        max_active=max_active,
        duration=duration,
        warmup=warmup,
        learn=learn,
        planner=planner,
        router=router,
        eviction=eviction,
        profile=profile,
        seed=seed,
        kv_fetch=kv_fetch,
        telemetry=telemetry,
        relaunch=relaunch,
        host_kv=host_kv,
        l1_tokens=l1_tokens,
        l2_tokens=l2_tokens,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        gpu_memory_gib=gpu_memory_gib,
        gpu_memory_utilization=gpu_memory_utilization,
        prefill_forms=prefill_forms or None,
        max_programs=max_programs,
        cycle=cycle or None,
        retention=retention,
        scheduling=scheduling,
        dispatch=dispatch,
        policy_param=tuple(policy_param),
        hook_budget=hook_budget,
        form=form,
    )
    try:
        cfg = options.to_config()  # checked: a bad option fails before the progress bar
        size_limits.PARTITIONS.check("--partitions", partitions)
        size_limits.check("--processes", processes, size_limits.PROCESSES)
    except ConfigError as err:
        console.print(f"[red]error:[/] {escape(str(err))}")
        raise typer.Exit(2) from None
    try:
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
                    f"{workload}: {partitions} partitions of {nodes // max(partitions, 1)} nodes",
                    total=partitions,
                )
                summary = simulate_partitioned(
                    cfg,
                    partitions,
                    db,
                    run_id,
                    processes=processes,
                    backend=backend,
                    on_done=lambda _r: bar.advance(task),
                    ray_address=address,
                )
            else:
                task = bar.add_task(f"{workload} on {nodes} nodes", total=duration)
                summary = simulate(
                    cfg, db, run_id, progress=lambda t: bar.update(task, completed=t)
                )
    except (ConfigError, ValueError) as err:
        console.print(f"[red]error:[/] {escape(str(err))}")
        raise typer.Exit(2) from None
    leave_garbage_to_os()  # the run is stored and its database closed
    summary = clean_json(summary)
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
    note = trace_note(summary, agents_given=agents is not None)
    if note:
        Console().print(note, soft_wrap=True, markup=False, highlight=False)
    for result, _ in fits or ():
        _print_table(result, None)
    runs = summary.get("partition_runs") or ([summary["run_id"]] if summary.get("run_id") else [])
    _print_next_steps(db, runs, fitted=fits is not None)


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
        ("pdlab lab", "JupyterLab on the notebooks, with a live cluster to control"),
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
    from toolkit.sim_options import clean_json

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
