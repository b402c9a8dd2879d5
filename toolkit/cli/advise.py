"""`pdlab advise DB`: rank the PD splits of N nodes for a recorded run's workload (SPEC §9).

Replays the run's requests on the cluster simulator for every split, and for the same
nodes as N collocated engines ("should I disaggregate at all?"; `--no-collocated` leaves
them out), and several seeds (toolkit.advise.run), prints a ranked table (mean and P90 TTFT, mean TPOT, mean E2E with 95%
intervals; the switch from the run's split: nodes moved, switch time, drained requests,
lost KV blocks, and the run's mean E2E with that switch), the best split per window with
an oscillation flag (toolkit.advise.windows) and the recommendation. Exit code 2 for bad
input: no such database or run, a run without requests or arrivals, fewer than 2 nodes,
an unknown profile, metric or switch mode.

`--json` prints one object:

    {"run_id", "nodes", "requests", "seeds", "rank_by", "current_split" (or null),
     "interval": "seeds" | "seeds+twin", "twin_run_id", "twin_error": {METRIC: e},
     "twin_interval": {METRIC: [lo, hi]} (the twin's 95% interval of its error),
     "twin_note" (twins of the run not used, and why),
     "recorded": {METRIC: value} (the real run, when it ran on current_split),
     "splits": [{"rank", "split", "prefill", "decode", "collocated" (N collocated engines:
                 split "N collocated", prefill = decode = 0),
                 "metrics": {METRIC: {"mean", "ci95": [lo, hi], "seeds": [...]}},
                 "unfinished_requests",
                 "switch": null | {"from", "mode", "nodes_moved", "t_switch_s",
                                   "switch_time_s", "switch_finished", "drained_requests",
                                   "lost_kv_blocks",
                                   "metrics": {METRIC: {...}}}}, ...],   # best first
     "windows": {"window_s", "best": [{"t0", "t1", "requests", "best", "values"}],
                 "pattern", "oscillating", "switches"},
     "recommendation": {"split", "value", "stay_value", "reason", "distinguishable",
                        "runner_up"}}

The twin (toolkit.advise.workload): `--twin RUN`, else the run's twin made with the same
`--profile`; a forced twin is refused. Its error widens each interval (toolkit.advise.run); an
error of 100% or more leaves the upper end not known ("not known" in the table, null in
JSON) rather than an interval from 0. "not distinguishable" when the best split's interval
overlaps the next best's.

METRIC is one of ttft_mean_s, ttft_p90_s, tpot_mean_s, e2e_mean_s, e2e_p90_s (seconds).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import typer

EXIT_INPUT = 2


def advise_command(
    db: Path = typer.Argument(..., help="DuckDB database holding the recorded run."),
    run: str | None = typer.Option(None, "--run", help="Run id (default: the only run)."),
    profile: str | None = typer.Option(
        None,
        "--profile",
        help="Simulator profile: a preset (h200, gb300), a `pdlab fit --json` or `pdlab "
        "profile import` file (default: the simulated run's own).",
    ),
    nodes: int | None = typer.Option(
        None, "--nodes", help="Nodes to split (default: the run's node count)."
    ),
    seeds: int = typer.Option(3, "--seeds", help="Simulator seeds per split."),
    twin: str | None = typer.Option(
        None,
        "--twin",
        help="Twin run whose error widens the intervals (default: the run's twin made with "
        "the same --profile; never a forced one). See `pdlab runs list`.",
    ),
    rank_by: str = typer.Option(
        "e2e_mean_s",
        "--rank-by",
        help="ttft_mean_s | ttft_p90_s | tpot_mean_s | e2e_mean_s | e2e_p90_s",
    ),
    window: float | None = typer.Option(
        None,
        "--window",
        help="Seconds per window for the oscillation check (default: the planner's window, "
        "600 s, or a quarter of a shorter run).",
    ),
    switch_mode: str | None = typer.Option(
        None,
        "--switch-mode",
        help="in-place | relaunch | strand (default: the run's planner's: gain in-place, "
        "dynamo relaunch, arrow strand).",
    ),
    collocated: bool = typer.Option(
        True,
        "--collocated/--no-collocated",
        help="Also rank the nodes as collocated engines (DP ranks), the baseline of "
        "disaggregating at all.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Rank the PD splits for a recorded run's workload, with intervals and switch costs."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from cluster import size_limits
    from telemetry import TelemetryError
    from toolkit.advise.run import advise
    from toolkit.advise.workload import load_run
    from toolkit.cli.sim_options import clean_json

    err = Console(stderr=True)
    try:
        size_limits.check("--nodes", nodes, size_limits.NODES)  # before any replay
        size_limits.SEEDS.check("--seeds", seeds)
        size_limits.check("--window", window, size_limits.SIM_SECONDS)
        rec = load_run(db, run, twin=twin, profile=profile)
        with Progress(
            TextColumn("[bold]advise[/] {task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} replays"),
            TimeElapsedColumn(),
            console=err,
            transient=True,
        ) as bar:
            task = bar.add_task(f"run {rec.run_id}", total=None)

            def progress(done: int, total: int, what: str) -> None:
                bar.update(task, completed=done, total=total, description=what)

            result = advise(
                rec,
                nodes=nodes,
                profile=profile,
                seeds=seeds,
                rank_by=rank_by,
                window_s=window,
                switch_mode=switch_mode,
                progress=progress,
                collocated=collocated,
            )
    except (ValueError, TelemetryError, FileNotFoundError) as exc:  # ConfigError: ValueError
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_INPUT) from None
    if as_json:
        typer.echo(json.dumps(clean_json(result.to_json())))
        return
    _print(result)


def _fmt(x: float | None, ci: tuple[float, float] | None = None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    text = f"{x:.3g}"
    if ci is not None and not math.isfinite(ci[1]):
        text += " (not known)"
    elif ci is not None and ci[1] > ci[0]:
        text += f" ({ci[0]:.3g}-{ci[1]:.3g})"
    return text


def _print(result: object) -> None:
    from rich.console import Console
    from rich.table import Table

    from toolkit.advise.run import Advice

    assert isinstance(result, Advice)
    out = Console()
    cur = result.current
    table = Table(
        title=f"PD splits{' and collocated engines' if any(s.prefill == 0 for s in result.splits) else ''} "
        f"of {result.nodes} nodes for run {result.run_id} "
        f"({result.requests} requests, {result.seeds} seed{'s' * (result.seeds > 1)}), "
        f"ranked by {result.rank_by}",
        caption="seconds, mean (95% interval: "
        + ("seed spread widened by the twin's measured error)" if result.interval != "seeds"
           else "seed spread; no twin of this run)"),
    )  # fmt: skip
    cols = ["#", "split", "TTFT mean", "TTFT P90", "TPOT mean", "E2E mean"]
    if cur is not None:
        cols += [f"moved from {cur}", "switch s", "drained", "lost KV", "E2E w/ switch"]
    for c in cols:
        table.add_column(c, justify="left" if c in ("#", "split") else "right")
    for i, s in enumerate(result.splits, 1):
        m = s.metrics
        name = s.split + (" (run)" if s.split == cur else "") + (" *" if s.unfinished else "")
        row = [str(i), name] + [
            _fmt(m[k].mean, m[k].ci95)
            for k in ("ttft_mean_s", "ttft_p90_s", "tpot_mean_s", "e2e_mean_s")
        ]
        if cur is not None:
            sw = s.switch
            relaunch = (
                sw is None and s.split != cur and (s.prefill == 0 or cur.endswith("collocated"))
            )
            row += (
                ["relaunch †" if relaunch else "-", "-", "-", "-", "-"]
                if sw is None
                else [
                    f"{sw.nodes_moved} {sw.mode}",
                    _fmt(sw.switch_time_s) if sw.finished else f"> {_fmt(sw.switch_time_s)}",
                    f"{sw.drained:.3g}",
                    f"{sw.lost_kv_blocks:.3g}",
                    _fmt(sw.metrics["e2e_mean_s"].mean, sw.metrics["e2e_mean_s"].ci95),
                ]
            )
        table.add_row(*row)
    out.print(table)
    if cur is not None and any(s.switch is None and s.split != cur for s in result.splits):
        out.print(
            "† moving between a PD split and collocated engines relaunches every engine in its "
            "new role: its cost is not modelled (none is counted)"
        )
    if any(s.unfinished for s in result.splits):
        out.print("* some requests did not finish in the replay; ranked last")
    if result.twin_run_id is not None:
        errs = []
        for k in ("ttft_mean_s", "tpot_mean_s", "e2e_mean_s"):
            if k not in result.twin_error:
                continue
            lo, hi = result.twin_interval.get(k, (math.nan, math.nan))
            ci = (
                f" [{100 * lo:+.1f}, {100 * hi:+.1f}]"
                if math.isfinite(lo) and math.isfinite(hi)
                else ""
            )
            errs.append(f"{k.removesuffix('_s')} {100 * result.twin_error[k]:+.1f}%{ci}")
        out.print(
            f"twin {result.twin_run_id} (its own error vs the real run, 95% interval): "
            + ", ".join(errs),
            highlight=False,
        )
        if any(lo <= -1.0 for lo, _ in result.twin_interval.values()):
            out.print(
                "[bold yellow]the twin's error reaches 100%:[/] the intervals it widens have no "
                "upper end (not known); make a twin that matches the run"
            )
    if result.twin_note:
        out.print(f"twin: {result.twin_note}", highlight=False)
    w = result.windows
    winners = ", ".join(f"{x.t0:.4g}-{x.t1:.4g} s: {x.best or '-'}" for x in w.windows)
    out.print(f"best split per {w.window_s:.4g} s window: {winners}", highlight=False)
    if w.oscillating:
        out.print(
            f"[bold yellow]oscillation:[/] the best split goes back and forth "
            f"({' -> '.join(w.pattern)}); a planner following it would switch {w.switches} times"
        )
    out.print(f"[bold]recommendation:[/] {result.recommendation.reason}")
