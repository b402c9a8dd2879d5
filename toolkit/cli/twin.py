"""`pdlab twin DB`: replay a recorded run on models of its serving, real vs sim (SPEC §9).

With `--profile P` (an imported benchmark run of one engine), the run's requests replay on
engine models (toolkit.twin.run). Without it, the run must be a PD cluster run (a live torch or
SGLang cluster, or a simulated one): its requests replay on the cluster simulator with each
node priced by Eq. 1 / Eq. 2 fitted from the run's own iteration logs (toolkit.twin.cluster),
so it needs no operator profile. `--no-rescale` keeps the fits' coefficients as they are
(by default each phase's are scaled to the run's measured pass time, toolkit.twin.cluster_inputs).

Prints, per metric (TTFT, TPOT, E2E: mean, P50, P90, P99; throughput), the real value, the
replay's, the relative error and its 95% interval: request resampling combined with the
model's own error (toolkit.twin.interval; `--no-interval` keeps the bootstrap's alone), and
whether it holds the real value; what each source adds to the mean metrics' intervals;
every parameter the replay rests on with its source and, when not exact, its range
(toolkit.twin.parameters); the profile checks (toolkit.twin.guards: a profile of another
model or GPU is refused unless `--force`, which marks the output and the stored run
FORCED) and "extrapolating" where the run's settings leave what the profile measured; the
engine settings the replay used, its wall time, per DP rank its requests, mean running and
iterations (dummy ones: a rank stepping with its MoE group without work), and the id of the
run the simulated requests were stored as (source 'twin'). `--json` prints one object with
"metrics": {"ttft_mean_s": {"real", "sim", "error", "ci95", "ci95_requests", "covered",
"half_width", "interval", "sources"}, ...}, "parameters": [{"name", "value", "unit",
"source", "low", "high", "note"}], "interval": {"sources"}, "dp_ranks", "guards", "forced",
"extrapolating". `--what-if KEY=VALUE`
(repeatable) replays the same requests under changed engine settings and estimates each
metric with an interval that carries the twin's measured error (toolkit.twin.whatif; split=XPYD
and router=NAME replay on the cluster simulator's PD nodes, toolkit.twin.pd); JSON
key "what_if". Exit code 2 for bad input (no such run, a run without requests, a profile
for another TP or model, an unknown what-if key).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from toolkit.cli.formatting import json_text, percent

if TYPE_CHECKING:
    from toolkit.twin.run import TwinResult
    from toolkit.twin.whatif import WhatIfResult

EXIT_INPUT = 2


def twin_command(
    db: Path = typer.Argument(..., help="DuckDB database with an imported run (pdlab import)."),
    run: str | None = typer.Option(None, "--run", help="Run id (default: the only or last run)."),
    profile: Path | None = typer.Option(
        None,
        "--profile",
        help="Operator profile from `pdlab profile import` (the run's TP), for an imported "
        "benchmark run. A PD cluster run (live torch/SGLang or simulated) needs none: its own "
        "iteration logs are fitted and it replays on the cluster simulator.",
    ),
    gpu_memory_gib: float | None = typer.Option(
        None, "--gpu-memory-gib", help="GPU memory per GPU: KV capacity from vLLM's budget."
    ),
    gpu_memory_utilization: float | None = typer.Option(
        None, "--gpu-memory-utilization", help="vLLM's --gpu-memory-utilization (default 0.9)."
    ),
    max_num_seqs: int | None = typer.Option(None, "--max-num-seqs", help="Batch limit."),
    max_num_batched_tokens: int | None = typer.Option(
        None, "--max-num-batched-tokens", help="Token budget per iteration."
    ),
    link_gbps: float | None = typer.Option(
        None, "--link-gbps", help="TP/EP collective bandwidth, GB/s (default: recorded, profile)."
    ),
    link_latency_us: float | None = typer.Option(
        None, "--link-latency-us", help="Latency of one collective, microseconds."
    ),
    store: bool = typer.Option(
        True, "--store/--no-store", help="Store the simulated requests as a 'twin' run."
    ),
    what_if_items: list[str] = typer.Option(
        [],
        "--what-if",
        help="KEY=VALUE engine setting to replay under (repeatable): max_num_seqs, "
        "max_num_batched_tokens, num_gpu_blocks, data_parallel_size, gpu_memory_gib, ...; "
        "split=XPYD or router=NAME replay on the cluster simulator's PD nodes",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the bootstrap resampling."),
    interval: bool = typer.Option(
        True,
        "--interval/--no-interval",
        help="Combine the bootstrap with the model's error (the profile's held-out residuals, "
        "assumed parameters at their ends): a few more replays.",
    ),
    interval_replays: int = typer.Option(
        4, "--interval-replays", min=2, help="Replays on draws of the profile's measurement error."
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="Replay with a profile of another model or GPU (the twin is marked FORCED).",
    ),
    rescale: bool = typer.Option(
        True,
        "--rescale/--no-rescale",
        help="PD cluster run: scale each phase's fitted coefficients so that they add up to "
        "the run's measured pass time (relative-error fits price a typical pass, not the mean).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Replay a recorded run's requests on models of its serving and compare with the real run."""
    engine = {
        "gpu_memory_gib": gpu_memory_gib,
        "gpu_memory_utilization": gpu_memory_utilization,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens,
        "link_gbps": link_gbps,
        "link_latency_s": None if link_latency_us is None else link_latency_us * 1e-6,
    }
    _check_sizes(engine, link_latency_us)
    if profile is None:
        given = [_ENGINE_FLAGS[k] for k, v in engine.items() if v is not None]
        given += ["--what-if"] * bool(what_if_items) + ["--force"] * force
        _cluster_twin(db, run, store, seed, rescale, as_json, given)
        return
    result, alt = _replay(
        db, run, profile, what_if_items, engine, store=store, seed=seed, interval=interval,
        interval_replays=interval_replays, force=force,
    )  # fmt: skip
    _report(result, alt, as_json)


# The engine settings of a replay and the flags that set them (a PD cluster run takes none).
_ENGINE_FLAGS = {
    "gpu_memory_gib": "--gpu-memory-gib",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "link_gbps": "--link-gbps",
    "link_latency_s": "--link-latency-us",
}


def _report(result: TwinResult, alt: WhatIfResult | None, as_json: bool) -> None:
    """The replay (and its what-if) as one JSON object or as text."""
    doc = result.to_json()
    if alt is not None:
        doc["what_if"] = alt.to_json()
    if as_json:
        typer.echo(json_text(doc))
        return
    from rich.console import Console

    console = Console()
    _print_replay(console, result, doc)
    if alt is not None:
        _print_what_if(console, alt)


def _check_sizes(engine: dict[str, Any], link_latency_us: float | None) -> None:
    """Every size checked before anything is read or allocated (cluster.size_limits)."""
    from cluster import size_limits as limits
    from cluster.core import ConfigError

    try:
        limits.check("--gpu-memory-gib", engine["gpu_memory_gib"], limits.GPU_MEMORY_GIB)
        limits.check(
            "--gpu-memory-utilization", engine["gpu_memory_utilization"], limits.UTILIZATION
        )
        limits.check("--max-num-seqs", engine["max_num_seqs"], limits.MAX_NUM_SEQS)
        limits.check(
            "--max-num-batched-tokens", engine["max_num_batched_tokens"], limits.BATCHED_TOKENS
        )
        limits.check("--link-gbps", engine["link_gbps"], limits.LINK_GBPS)
        limits.check("--link-latency-us", link_latency_us, limits.LINK_LATENCY_US)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_INPUT) from None


def _replay(
    db: Path,
    run: str | None,
    profile: Path,
    what_if_items: list[str],
    engine: dict[str, Any],
    *,
    store: bool,
    seed: int,
    interval: bool,
    interval_replays: int,
    force: bool,
) -> tuple[TwinResult, WhatIfResult | None]:
    """The twin's replay of the run, and of its what-if if one was asked (exit 2 on bad input)."""
    from telemetry import TelemetryError
    from toolkit.twin.run import run_twin
    from toolkit.twin.whatif import PD_KEYS, parse_changes, what_if

    try:
        changes = parse_changes(what_if_items) if what_if_items else None
        result = run_twin(
            db,
            run,
            profile,
            store=store,
            seed=seed,
            interval=interval,
            profile_replays=interval_replays,
            force=force,
            **engine,
        )
        alt: WhatIfResult | None = None
        if changes is not None and changes.keys() & set(PD_KEYS):
            from toolkit.twin.pd import pd_what_if

            alt = pd_what_if(result, profile, changes, seed=seed)
        elif changes is not None:
            alt = what_if(result, changes, seed=seed)
    except (ValueError, TelemetryError, FileNotFoundError) as exc:  # ConfigError is a ValueError
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_INPUT) from None
    return result, alt


def _print_replay(console: Any, result: TwinResult, doc: dict[str, Any]) -> None:
    """The replay's metrics, sources, guards, engine settings and ranks, as text."""
    if result.forced:
        console.print(_forced_line(doc["guards"]))
    console.print(_metrics_table(result.run_id, doc["requests"], result.metrics))
    if result.sources:
        from toolkit.twin.report import sources_table

        console.print(sources_table(result.sources, result.metrics))
    _print_guards(console, doc)
    e = doc["engine"]
    console.print(
        f"engine: max_num_seqs={e['max_num_seqs']}, max_num_batched_tokens="
        f"{e['max_num_batched_tokens']}, TP {e['tensor_parallel_size']}, DP "
        f"{e['data_parallel_size']}, EP {e['expert_parallel_size']}, KV {e['kv_blocks']} blocks "
        f"({e['kv_source']}), link {e['link_gbps']:g} GB/s + {1e6 * e['link_latency_s']:g} us "
        f"({e['link_source']})"
    )
    extra = doc["interval"]["replays"]
    console.print(
        f"replayed {doc['iterations']} iterations ({doc['preemptions']} preemptions) in "
        f"{result.replay_wall_s:.2f} s"
        + (
            f", and {extra} more for the interval in {result.interval_wall_s:.1f} s"
            if extra
            else ""
        )
        + (f"; stored as run {result.twin_run_id}" if result.twin_run_id else "")
    )
    _print_ranks_and_parameters(console, doc)


def _print_what_if(console: Any, alt: WhatIfResult) -> None:
    """The what-if's estimates with their intervals (and a PD what-if's baseline error)."""
    from rich.table import Table

    from toolkit.twin.whatif import PD_KEYS

    wt = Table(
        title="what if " + ", ".join(f"{k}={v}" for k, v in alt.changes.items()),
        caption="estimate = real x what-if replay / baseline replay; the interval adds the "
        "twin's measured error to the bootstrap spread",
    )
    for col in ("metric", "real", "estimate", "change", "95% interval"):
        wt.add_column(col, justify="left" if col == "metric" else "right")
    for name, w in alt.metrics.items():
        wt.add_row(
            name,
            f"{w.real:.4g}",
            f"{w.estimate:.4g}",
            f"{100 * w.change:+.1f}%",
            f"[{w.ci95[0]:.4g}, {w.ci95[1]:.4g}]",
        )
    console.print(wt)
    console.print(f"what-if replay: KV {alt.kv_blocks} blocks, {alt.preemptions} preemptions")
    if alt.changes.keys() & set(PD_KEYS):
        errors = ", ".join(
            f"{name} {100 * (m.baseline_sim / m.real - 1):+.1f}%"
            for name, m in alt.metrics.items()
            if name.endswith("_mean_s") and m.real
        )
        console.print(
            "baseline (the cluster simulator's replay of the recorded layout) vs real: " + errors
        )


def _print_ranks_and_parameters(console: Any, doc: dict[str, Any]) -> None:
    """Per DP rank what the replay did, and what no data measured (toolkit.twin.parameters)."""
    cal = doc.get("profile_calibration")
    if cal:
        console.print(
            f"profile calibrated in situ: fitted on run {cal['fitted_on']} (fixed costs "
            f"x{cal['fixed_factor']:.3g}, per-unit costs x{cal['unit_factor']:.3g}, link fitted "
            "on its lockstep steps); compare it on other runs"
        )
    ranks = doc["dp_ranks"]
    if len(ranks) > 1:
        console.print(
            f"DP ranks ({doc['engine']['ranks']}): "
            + "; ".join(
                f"{r['rank']}: {r['requests']} requests, {r['running_mean']:.1f} running on "
                f"average (max {r['running_max']}), {r['iterations']} iterations"
                + (f" + {r['dummy_iterations']} dummy" if r["dummy_iterations"] else "")
                for r in ranks
            )
        )

    def fmt(v: float | None) -> str:
        if v is None or not math.isfinite(v):
            return "not known"
        return f"{v:.0f}" if v == int(v) and abs(v) >= 1 else f"{v:.3g}"

    console.print(
        "replay parameters (source; range when not exact): "
        + "; ".join(
            f"{p['name']} = {fmt(p['value'])} ({p['source']}"
            + (f", range {fmt(p['low'])}-{fmt(p['high'])}" if p["ranged"] else "")
            + ")"
            for p in doc["parameters"]
        )
    )


def _forced_line(guards: dict[str, Any]) -> str:
    bad = [g for g in (guards["model"], guards["gpu"]) if g.startswith("FORCED")]
    return (
        "[bold red]FORCED:[/] --force replayed this run on a profile that does not describe it ("
        + "; ".join(b.removeprefix("FORCED: ") for b in bad)
        + "): the numbers below describe that profile, not this run"
    )


def _print_guards(console: Any, doc: dict[str, Any]) -> None:
    g = doc.get("guards")
    if not g:
        return
    console.print(f"profile checks: model {g['model']}; GPU {g['gpu']}", highlight=False)
    if doc["extrapolating"]:
        console.print(
            "[bold yellow]extrapolating:[/] " + "; ".join(doc["extrapolating"]), highlight=False
        )


def _metrics_table(run_id: str, requests: int, metrics: dict[str, Any]) -> Any:
    from rich.table import Table

    combined = any(getattr(m, "sources", None) for m in metrics.values())
    table = Table(
        title=f"twin of run {run_id}: {requests} requests replayed",
        caption="seconds (throughput: requests/s); error = sim / real - 1; 95% interval of the "
        + (
            "error: requests resampled, the profile's held-out error and the assumed "
            "parameters' ranges (below); covered: it holds the real value"
            if combined
            else "error: requests resampled"
        ),
    )
    cols = ["metric", "real", "sim", "error", "95% interval"] + (["covered"] if combined else [])
    for col in cols:
        table.add_column(col, justify="left" if col == "metric" else "right")
    for name, m in metrics.items():
        lo, hi = m.ci95
        known = math.isfinite(hi) and lo > -1.0
        ci = f"[{100 * lo:+.1f}%, {100 * hi:+.1f}%]" if known else "not known"
        row = [name, f"{m.real:.4g}", f"{m.sim:.4g}", f"{100 * m.error:+.1f}%", ci]
        if combined:
            row.append("-" if not known else "yes" if m.covered else "[bold]no[/]")
        table.add_row(*row)
    return table


def _cluster_twin(
    db: Path,
    run: str | None,
    store: bool,
    seed: int,
    rescale: bool,
    as_json: bool,
    engine_flags: list[str],
) -> None:
    """The twin of a PD cluster run (no --profile): toolkit.twin.cluster."""
    from telemetry import TelemetryError
    from toolkit.twin.cluster import run_cluster_twin

    if engine_flags:
        typer.echo(
            f"error: {', '.join(engine_flags)} set an engine model's settings: they need "
            "--profile (the twin of a PD cluster run takes its settings from the run)",
            err=True,
        )
        raise typer.Exit(EXIT_INPUT)
    try:
        result = run_cluster_twin(db, run, store=store, seed=seed, rescale=rescale)
    except (ValueError, TelemetryError, FileNotFoundError) as exc:  # ConfigError is a ValueError
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_INPUT) from None
    doc = result.to_json()
    if as_json:
        typer.echo(json_text(doc))
        return
    from rich.console import Console

    console = Console()
    console.print(_metrics_table(result.run_id, doc["requests"], result.metrics))
    c = doc["cluster"]
    fits = ", ".join(
        f"node {f['node_id']} {f['phase']} {percent(f['mape'], 0)}"
        for f in c["fits"]
        if f["mape"] is not None
    )
    console.print(
        f"cluster: {c['nodes']} nodes {c['split']} (static), router {c['router']}, KV "
        f"{c['kv_tokens']} tokens per node in blocks of {c['block_tokens']}; each phase priced "
        f"by the run's fits (held-out MAPE: {fits}) times {c['scale']['prefill']:.2f} "
        f"(prefill) and {c['scale']['decode']:.2f} (decode), their measured / modelled pass time"
    )
    if c["overheads"]:
        o = c["overheads"]
        parts = ", ".join(f"{k} {1e3 * v['mean_s']:.1f}" for k, v in o.items())
        console.print(f"serving overheads (mean ms, from the run's request stages): {parts}")
    if c["switches"]:
        console.print(
            f"[yellow]note:[/yellow] the run switched phases {c['switches']} times; the twin "
            "keeps its initial split"
        )
    console.print(
        f"simulated {doc['iterations']} iterations in {result.replay_wall_s:.2f} s"
        + (f"; stored as run {result.twin_run_id}" if result.twin_run_id else "")
    )
