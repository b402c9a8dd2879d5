"""Policies compared over seeds with 95% intervals (paper 003 §5.2 sweeps; notebook 05).

Left: each policy's metric, the mean over seeds (dot) with its Student-t 95% interval (bar)
and every seed's value (small marks), policies ranked best first. Right, with a baseline:
the change against it paired by seed, with its interval; an interval that crosses 0 is a
change the seeds cannot tell from none. Data from `toolkit.queries.seeds`.
"""

from __future__ import annotations

import math
from pathlib import Path

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from toolkit.plots.common import house, percent_axis, round_step
from toolkit.queries.seeds import SeedIntervals, seed_intervals, sweep_rows

# metric -> (what it is, unit; "%" for a fraction shown as a percent, lower is better)
METRICS: dict[str, tuple[str, str, bool]] = {
    "mean_jct_s": ("mean job completion time", "s", True),
    "p50_jct_s": ("median job completion time", "s", True),
    "p99_jct_s": ("P99 job completion time", "s", True),
    "mean_ttft_s": ("mean time to first token", "s", True),
    "p50_ttft_s": ("median time to first token", "s", True),
    "p95_ttft_s": ("P95 time to first token", "s", True),
    "mean_tpot_s": ("mean time per output token", "s/token", True),
    "mean_e2e_s": ("mean end-to-end latency", "s", True),
    "p95_e2e_s": ("P95 end-to-end latency", "s", True),
    "mean_queueing_s": ("mean queueing time", "s", True),
    "throughput_rps": ("throughput", "requests/s", False),
    "kv_hit_rate": ("KV hit rate", "%", False),
    "lost_kv_reuse": ("lost KV reuse", "%", True),
    "preemptions": ("preemptions", "count", True),
}


def signed_percent_ticks(values: list[float], ticks: int = 5) -> dict[str, object]:
    """Tick settings for a signed change shown in percent: a round step, as many decimals
    as the step needs (no two labels alike)."""
    lo, hi = min(values), max(values)
    step = round_step(max(hi - lo, 1e-6) / ticks)
    decimals = max(0, -math.floor(math.log10(100 * step) + 1e-9))
    return {"tick0": 0.0, "dtick": step, "tickformat": f"+.{decimals}%"}


def format_interval(metric: str, mean: float, lo: float | None, hi: float | None) -> str:
    """'mean [lo, hi]' in the metric's unit (a fraction in percent)."""
    pct = METRICS.get(metric, ("", "", True))[1] == "%"

    def f(v: float | None) -> str:
        return "—" if v is None else (f"{100 * v:.1f}%" if pct else f"{v:.3g}")

    return f"{f(mean)} [{f(lo)}, {f(hi)}]" if lo is not None else f(mean)


def metric_label(metric: str) -> str:
    what, unit, _ = METRICS.get(metric, (metric.replace("_", " "), "", True))
    return f"{what} ({unit})" if unit and unit != "%" else what


def draw_seed_intervals(data: SeedIntervals, title: str | None = None) -> go.Figure:
    """The figure of a `seed_intervals` result (module docstring)."""
    t = data.table
    pct = METRICS.get(data.metric, ("", "", True))[1] == "%"
    paired = data.baseline is not None
    fig = make_subplots(
        rows=1,
        cols=2 if paired else 1,
        shared_yaxes=True,
        column_widths=[0.58, 0.42] if paired else [1.0],
        horizontal_spacing=0.04,
        subplot_titles=(
            (
                f"mean over seeds, {data.level:.0%} interval",
                f"change vs {data.baseline}, paired by seed",
            )
            if paired
            else ()
        ),
    )
    names = t["policy"].to_list()
    err_hi = [(h - m) if h is not None else None for m, h in zip(t["mean"], t["hi"], strict=True)]
    err_lo = [
        (m - lo) if lo is not None else None for m, lo in zip(t["mean"], t["lo"], strict=True)
    ]
    fmt = ".1%" if pct else ".4g"
    fig.add_trace(
        go.Scatter(
            x=t["mean"].to_list(),
            y=names,
            mode="markers",
            marker={"size": 10, "color": "#1f77b4"},
            error_x={"type": "data", "array": err_hi, "arrayminus": err_lo, "thickness": 2},
            name=f"mean ± {data.level:.0%} interval",
            customdata=list(zip(t["seeds"], t["rank"], strict=True)),
            hovertemplate="%{y}: %{x:" + fmt + "} (rank %{customdata[1]}, "
            "%{customdata[0]} seeds)<extra></extra>",
        ),
        row=1,
        col=1,
    )
    seeds_x = [v for vs in t["values"].to_list() for v in vs]
    seeds_y = [n for n, vs in zip(names, t["values"].to_list(), strict=True) for _ in vs]
    fig.add_trace(
        go.Scatter(
            x=seeds_x,
            y=seeds_y,
            mode="markers",
            marker={"size": 6, "color": "rgba(31,119,180,0.35)", "symbol": "line-ns-open"},
            name="one seed",
            hovertemplate="%{y}: %{x:" + fmt + "}<extra>one seed</extra>",
        ),
        row=1,
        col=1,
    )
    label = metric_label(data.metric)
    if pct:
        fig.update_xaxes(
            **percent_axis([*seeds_x, *t["lo"].to_list(), *t["hi"].to_list()]), row=1, col=1
        )
    fig.update_xaxes(title_text=label, row=1, col=1)
    if paired:
        c = t.filter(pl.col("policy") != data.baseline)
        fig.add_trace(
            go.Scatter(
                x=c["change"].to_list(),
                y=c["policy"].to_list(),
                mode="markers",
                marker={"size": 10, "color": "#d62728", "symbol": "diamond"},
                error_x={
                    "type": "data",
                    "array": [(h - m) if h is not None else None for m, h in zip(c["change"], c["change_hi"], strict=True)],
                    "arrayminus": [(m - lo) if lo is not None else None for m, lo in zip(c["change"], c["change_lo"], strict=True)],
                    "thickness": 2,
                },
                name=f"change vs {data.baseline} ± {data.level:.0%} interval",
                hovertemplate="%{y}: %{x:+.1%} vs " + str(data.baseline) + "<extra></extra>",
            ),
            row=1,
            col=2,
        )  # fmt: skip
        fig.add_vline(x=0, line={"color": "#555", "width": 1}, row=1, col=2)
        spread = [
            v
            for v in (*c["change_lo"].to_list(), *c["change_hi"].to_list(), *c["change"].to_list())
            if v is not None
        ]
        fig.update_xaxes(
            title_text=f"change of {METRICS.get(data.metric, (label,))[0]} (%)",
            **signed_percent_ticks([*spread, 0.0]),
            row=1,
            col=2,
        )
    fig.update_yaxes(categoryorder="array", categoryarray=names[::-1], row=1, col=1)
    better = "lower" if data.lower_is_better else "higher"
    n = sorted(set(t["seeds"].to_list()))
    note = f"ranked best first ({better} is better); {'/'.join(map(str, n))} seeds per policy"
    height = 210 + 40 * len(names)
    fig = house(fig, title or f"{label} by policy over seeds", note=note, height=height)
    fig.update_layout(
        legend={"orientation": "h", "yanchor": "top", "y": -70 / (height - 220), "x": 0},
        margin={"t": 90, "b": 130},
    )
    fig.layout.meta = {"pdlab_title": title or label, "table": t.drop("values").to_dicts()}
    return fig


def sweep_intervals(
    rows: pl.DataFrame | list[dict],
    metric: str = "mean_jct_s",
    *,
    baseline_point: int | None = 0,
    title: str | None = None,
) -> go.Figure:
    """The points of a sweep over its seeds: `run_points`' rows or `sweep_results`'."""
    table = sweep_rows(rows, metric)
    if table.is_empty():
        raise ValueError("no sweep rows to draw")
    base = None
    if baseline_point is not None:
        got = table.filter(pl.col("point") == baseline_point)["policy"]
        base = got[0] if got.len() else None
    lower = METRICS.get(metric, ("", "", True))[2]
    data = seed_intervals(table, metric, baseline=base, lower_is_better=lower)
    return draw_seed_intervals(data, title or f"{metric_label(metric)} by sweep point over seeds")


def stored_sweep_intervals(
    db: str | Path, sweep_id: str | None = None, metric: str = "mean_jct_s"
) -> go.Figure:
    """`sweep_intervals` of a sweep stored by `pdlab sweep --db` (the only one, or `sweep_id`)."""
    from cluster.sweep import read_results

    rows = read_results(db, sweep_id)
    if rows.is_empty():
        raise ValueError(
            f"no sweep results in {db}" + (f" for sweep {sweep_id!r}" if sweep_id else "")
        )
    sweeps = sorted(rows["sweep_id"].unique().to_list())
    if len(sweeps) > 1:
        raise ValueError(f"{db} holds {len(sweeps)} sweeps; choose one of: {', '.join(sweeps)}")
    return sweep_intervals(
        rows, metric, title=f"sweep {sweeps[0]}: {metric_label(metric)} by point over seeds"
    )
