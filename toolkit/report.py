"""A run's key figures and summary in one self-contained HTML file (SPEC §7 `pdlab report`).

The summary recomputes the SPEC §7 run-summary keys from the SPEC §3 tables alone, with the
simulator's conventions (cluster.sim.metrics): latency and KV metrics over requests that
arrived after the warmup and finished, throughput over requests finished in the measured
period, switches completed after the warmup. The tables hold finished requests only, so
KV hit rates can differ slightly from a simulator summary that also counted requests still
in flight at the end; wall time is not logged and is left out. The figures are those of
`toolkit.plots.FIGURES` the run can fill (`toolkit.queries.content`: a request-only import
gets its latency distributions and running/waiting series, iteration logs add the pass
timeline and fits, a PD cluster its split and planner, an MoE model φ(B)), with one line
saying what is left out and why; for a run written by `pdlab twin` also `TWIN_FIGURES`
(real vs twin). plotly.js is embedded once (no network needed to view the file).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import duckdb
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from telemetry import TelemetryError
from toolkit.plots import FIGURES, TWIN_FIGURES
from toolkit.queries.content import run_content, select_figures
from toolkit.queries.reuse import reuse_totals
from toolkit.queries.run import Run, Source, open_run
from toolkit.queries.split import phase_segments


class ReportError(Exception):
    """The report cannot be built (missing database, unknown run, unknown figure name)."""


class FigureFailure(NamedTuple):
    name: str
    error: str


class Report(NamedTuple):
    html: str
    run_id: str
    summary: dict[str, Any]
    titles: dict[str, str]  # figure name -> title shown
    failures: tuple[FigureFailure, ...]
    absent: str | None = None  # what is left out and why (figures picked by content)


def _split_name(final: dict[str, int]) -> str | None:
    if not any(final.get(p) for p in ("prefill", "decode", "collocated")):
        return None  # no node's phase is known (an imported request-only run)
    if final.get("collocated") and not final.get("prefill") and not final.get("decode"):
        return "collocated"
    return f"{final.get('prefill', 0)}P{final.get('decode', 0)}D"


def summarize_run(run: Run) -> dict[str, Any]:
    """The SPEC §7 run-summary keys computed from the telemetry tables of one run."""
    cfg = run.config()
    t0, t_end = run.warmup_s(), run.t_end()
    measured = max(t_end - t0, 0.0)
    lat = run.df(
        """
        SELECT count(*) AS requests,
               avg(t_first_token - t_arrival) AS mean_ttft_s,
               quantile_cont(t_first_token - t_arrival, [0.5, 0.95]) AS ttft_q,
               avg(t_done - t_arrival) AS mean_e2e_s,
               quantile_cont(t_done - t_arrival, [0.5, 0.95]) AS e2e_q
        FROM requests WHERE run_id = ? AND t_arrival >= ? AND t_done IS NOT NULL
        """,
        [run.run_id, t0],
    ).row(0, named=True)
    finished = run.scalar(
        "SELECT count(*) FROM requests WHERE run_id = ? AND t_done BETWEEN ? AND ?",
        [run.run_id, t0, max(t_end, t0)],
    )
    sw = run.df(
        "SELECT count(*) AS n, avg(t_done - t_decided) AS mean_s FROM phase_switches "
        "WHERE run_id = ? AND t_done IS NOT NULL AND t_done >= ?",
        [run.run_id, t0],
    ).row(0, named=True)
    final: dict[str, int] = {}
    for phase in phase_segments(run).final.values():
        final[phase] = final.get(phase, 0) + 1
    kv = reuse_totals(run)
    if cfg.get("importer") and not kv["t_c"]:
        # Importers of request records store t_c = 0 when the benchmark did not record
        # cached tokens: the hit rate is unknown, not 0.
        kv = {**kv, "h": None, "lost": None}
    tq = lat["ttft_q"] or [None, None]
    eq = lat["e2e_q"] or [None, None]
    source = run.scalar("SELECT source FROM runs WHERE run_id = ? LIMIT 1", [run.run_id])
    summary: dict[str, Any] = {
        "run_id": run.run_id,
        "source": source,
        "workload": cfg.get("workload"),
        "nodes": run.nodes().height,
        "initial_split": cfg.get("split"),
        "planner": cfg.get("planner"),
        "router": cfg.get("router"),
        "eviction": cfg.get("eviction"),
        "profile": cfg.get("profile"),
        "seed": cfg.get("seed"),
        "sim_seconds": t_end,
        "warmup_seconds": t0,
        "measured_seconds": measured,
        "requests": int(lat["requests"]),
        "throughput_rps": finished / measured if measured > 0 else None,
        "mean_ttft_s": lat["mean_ttft_s"],
        "p50_ttft_s": tq[0],
        "p95_ttft_s": tq[1],
        "mean_e2e_s": lat["mean_e2e_s"],
        "p50_e2e_s": eq[0],
        "p95_e2e_s": eq[1],
        "kv_hit_rate": kv["h"],
        "ideal_kv_hit_rate": kv["h_star"],
        "lost_kv_reuse": kv["lost"],
        "switches": int(sw["n"]),
        "mean_switch_time_s": float(sw["mean_s"]) if sw["mean_s"] is not None else 0.0,
        "final_split": _split_name(final) if final else None,
    }
    return summary


def _cell(key: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, float):
        if key in ("kv_hit_rate", "ideal_kv_hit_rate", "lost_kv_reuse"):
            return f"{100 * value:.2f}%"
        return f"{value:,.4g}" if abs(value) < 1e5 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return html.escape(str(value))


_CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, Roboto, sans-serif; margin: 24px auto;
       max-width: 1320px; color: #222; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin: 28px 0 6px; }
.meta { color: #666; font-size: 13px; }
.tables { display: flex; gap: 48px; align-items: flex-start; }
table.summary { border-collapse: collapse; font-size: 13px; }
table.summary td { padding: 3px 12px; border-bottom: 1px solid #eee; }
table.summary td.k { color: #555; font-family: ui-monospace, monospace; }
nav a { margin-right: 12px; font-size: 13px; }
.figure { border-top: 1px solid #ddd; padding-top: 4px; }
.absent { margin: 10px 0; }
.failed { color: #b00; font-family: ui-monospace, monospace; white-space: pre-wrap; }
"""


def _figure_html(name: str, fig: go.Figure) -> str:
    height = fig.layout.height or 480
    return fig.to_html(
        full_html=False,
        include_plotlyjs=False,
        div_id=f"pdlab-fig-{name}",
        default_height=f"{height}px",
        config={"displaylogo": False, "responsive": True},
    )


def build_report(
    db: Source,
    run_id: str | None = None,
    figures: Sequence[str] | None = None,
    timeline_window: tuple[float, float] | None = None,
) -> Report:
    """The report of one run as an HTML string, with its summary and figure titles.

    `figures` picks names of `toolkit.plots.FIGURES` (default: those the run can fill, in
    that order, and a note of the others). `timeline_window` (t0, t1 in s) is the pass
    timeline's window (default: around the busiest moment). A figure that raises is shown
    as an error block and listed in `failures`.
    """
    every = {**FIGURES, **TWIN_FIGURES}
    names = list(FIGURES) if figures is None else list(figures)
    unknown = [n for n in names if n not in every]
    if unknown:
        raise ReportError(f"unknown figure(s) {unknown}; choose from: {', '.join(every)}")
    absent = None
    try:
        with open_run(db, run_id) as run:
            rid, label = run.run_id, run.label
            summary = summarize_run(run)
            if figures is None:
                picked = select_figures(run_content(run))
                names, absent = picked.names, picked.note()
            if figures is None and summary.get("source") == "twin":
                names = [*TWIN_FIGURES, *names]
    except TelemetryError as exc:
        raise ReportError(str(exc)) from None
    except duckdb.Error as exc:
        raise ReportError(f"cannot read {db!s} as a DuckDB telemetry database: {exc}") from None
    sections, titles, failures = [], {}, []
    for name in names:
        try:
            kwargs = {"window": timeline_window} if name == "timeline" else {}
            fig = every[name](db, rid, **kwargs)
        except Exception as exc:  # a broken figure must not hide the others; it is reported
            failures.append(FigureFailure(name, f"{type(exc).__name__}: {exc}"))
            titles[name] = name
            sections.append(
                f'<section class="figure" id="{name}"><h2>{html.escape(name)}</h2>'
                f'<p class="failed">figure failed: {html.escape(failures[-1].error)}</p></section>'
            )
            continue
        meta = fig.layout.meta if isinstance(fig.layout.meta, dict) else {}
        title = str(meta.get("pdlab_title") or name)
        titles[name] = title
        sections.append(
            f'<section class="figure" id="{name}"><h2>{html.escape(title)}</h2>'
            f"{_figure_html(name, fig)}</section>"
        )
    # Two tables side by side: what ran, and what it measured.
    setup = {"run_id", "source", "workload", "nodes", "initial_split", "planner", "router"}
    setup |= {"eviction", "profile", "seed", "sim_seconds", "warmup_seconds", "measured_seconds"}
    tables = "".join(
        '<table class="summary">'
        + "".join(
            f'<tr><td class="k">{html.escape(k)}</td><td>{_cell(k, v)}</td></tr>'
            for k, v in summary.items()
            if (k in setup) == first
        )
        + "</table>"
        for first in (True, False)
    )
    nav = "".join(f'<a href="#{n}">{html.escape(titles[n])}</a>' for n in names)
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    # plotly.js contains no "</script"; escaping keeps that true for any future version.
    plotly_js = get_plotlyjs().replace("</script", "<\\/script")
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>pdlab report · {html.escape(rid)}</title>
<style>{_CSS}</style>
<script type="text/javascript">{plotly_js}</script>
</head><body>
<h1>pdlab report · run {html.escape(rid)}</h1>
<p class="meta">database {html.escape(label)} · generated {generated}</p>
<h2>Summary</h2>
<div class="tables">{tables}</div>
<p class="meta">Latency and KV metrics over finished requests that arrived after the warmup;
throughput over requests finished after it.</p>
<nav>{nav}</nav>
{f'<p class="meta absent">{html.escape(absent)}</p>' if absent else ""}
{"".join(sections)}
</body></html>
"""
    return Report(page, rid, summary, titles, tuple(failures), absent)


def write_report(
    db: Source,
    output: str | Path,
    run_id: str | None = None,
    figures: Sequence[str] | None = None,
    timeline_window: tuple[float, float] | None = None,
) -> Report:
    """Build the report and write it to `output` (parent folders must exist)."""
    out = Path(output)
    if not out.parent.is_dir():
        raise ReportError(f"output folder {str(out.parent)!r} does not exist")
    report = build_report(db, run_id, figures, timeline_window)
    out.write_text(report.html, encoding="utf-8")
    return report
