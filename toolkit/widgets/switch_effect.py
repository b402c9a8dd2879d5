"""The effect of one phase switch on latency, read from telemetry (paper 000 §4.2, SPEC §3).

For a switch decided at t_decided and completed at t_done, compares the requests that
arrived in the `window_s` before the decision with those that arrived in the `window_s`
after completion: count, TTFT and E2E (mean, P95), completed throughput, and the change
after - before of the means with a 95% bootstrap interval (requests resampled within each
window).

Right-censoring. A run still being written (or one that ended with requests in flight)
holds requests that arrived but have not finished: a `requests` row is written when a
request completes. Keeping only finished requests drops the slow ones among the late
arrivals, so "after" looks faster than it was. Here:
- requests in flight are counted: a request the router placed (`router_decisions`) with
  no `requests` row yet arrived at its routing time and is still running at the data's end
  (the latest time any of these rows record);
- latencies are compared up to a horizon H (a restricted mean, as survival analysis does):
  each request's TTFT and E2E are capped at H, and only arrivals at least H before the
  data's end are compared, so every compared request's capped value is known (finished, or
  in flight for at least H). The after window is cut there. H defaults to three times the
  median E2E of the before window's finished requests, at most half the window.
`capped` counts the requests whose E2E reached H; with none, the means are the plain means.
Without router decisions in the run, requests in flight cannot be seen: `in_flight` is
None (the comparison then holds only the finished ones). The figure bins the same capped latencies by arrival time,
shades the switch and the arrivals too recent to compare.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import plotly.graph_objects as go
import polars as pl

from toolkit.plots.common import style

BOOTSTRAP = 1000


class _Arrivals(NamedTuple):
    t_arrival: np.ndarray
    ttft: np.ndarray  # NaN: first token not out by the data's end
    e2e: np.ndarray  # NaN: in flight at the data's end
    t_done: np.ndarray
    end: float  # the data's end
    in_flight_known: bool


def _switch(reader: Any, run_id: str, node_id: int | None) -> dict[str, Any]:
    where = "run_id = ? AND t_done IS NOT NULL" + (
        " AND node_id = ?" if node_id is not None else ""
    )
    params: list[Any] = [run_id] + ([node_id] if node_id is not None else [])
    df = reader.sql(f"SELECT * FROM phase_switches WHERE {where} ORDER BY t_done DESC", params)
    if df.is_empty():
        who = "" if node_id is None else f" of node {node_id}"
        raise LookupError(
            f"run {run_id!r} has no completed phase switch{who} yet "
            "(a switch is logged when the node serves its new phase)"
        )
    return df.row(0, named=True)


def _arrivals(reader: Any, run_id: str) -> _Arrivals:
    done = reader.sql(
        "SELECT request_id, t_arrival, t_first_token, t_done FROM requests WHERE run_id = ?",
        [run_id],
    )
    routed = reader.sql(
        "SELECT request_id, min(t) AS t FROM router_decisions WHERE run_id = ? GROUP BY 1",
        [run_id],
    )
    known = routed.height > 0
    flying = (
        routed.join(done.select("request_id"), on="request_id", how="anti") if known else routed
    )
    t_arr = np.concatenate([done["t_arrival"].to_numpy(), flying["t"].to_numpy()]).astype(float)
    first = np.concatenate(
        [done["t_first_token"].fill_null(np.nan).to_numpy(), np.full(flying.height, np.nan)]
    ).astype(float)
    t_done = np.concatenate(
        [done["t_done"].fill_null(np.nan).to_numpy(), np.full(flying.height, np.nan)]
    ).astype(float)
    times = [x for x in (t_arr, first, t_done) if x.size and np.isfinite(x).any()]
    end = float(max(np.nanmax(x) for x in times)) if times else 0.0
    return _Arrivals(t_arr, first - t_arr, t_done - t_arr, t_done, end, known)


def _capped(latency: np.ndarray, t_arrival: np.ndarray, end: float, h: float) -> np.ndarray:
    """min(latency, H); a request not done by the data's end waited at least end - arrival."""
    waited = np.where(np.isfinite(latency), latency, end - t_arrival)
    return np.minimum(waited, h)


def _horizon(a: _Arrivals, t0: float, window_s: float) -> float:
    before = (a.t_arrival >= t0 - window_s) & (a.t_arrival < t0) & np.isfinite(a.e2e)
    med = float(np.median(a.e2e[before])) if before.any() else window_s / 2
    return float(min(max(3.0 * med, 1e-9), window_s / 2))


def _diff_ci(
    before: np.ndarray, after: np.ndarray, rng: np.random.Generator
) -> tuple[float, float]:
    if before.size < 2 or after.size < 2:
        return float("nan"), float("nan")
    b = before[rng.integers(0, before.size, (BOOTSTRAP, before.size))].mean(axis=1)
    a = after[rng.integers(0, after.size, (BOOTSTRAP, after.size))].mean(axis=1)
    lo, hi = np.percentile(a - b, [2.5, 97.5])
    return float(lo), float(hi)


def switch_effect(
    reader: Any,
    run_id: str,
    node_id: int | None = None,
    window_s: float = 120.0,
    horizon_s: float | None = None,
    seed: int = 0,
) -> pl.DataFrame:
    """Before/after latency of the latest completed switch (module docstring): rows
    `before`, `after` and `after - before` (the change of the means, with `*_ci95`)."""
    sw = _switch(reader, run_id, node_id)
    t0, t1 = float(sw["t_decided"]), float(sw["t_done"])
    a = _arrivals(reader, run_id)
    h = horizon_s if horizon_s is not None else _horizon(a, t0, window_s)
    ttft = _capped(a.ttft, a.t_arrival, a.end, h)
    e2e = _capped(a.e2e, a.t_arrival, a.end, h)
    rows, picked = [], []
    for period, lo, hi in (
        ("before", t0 - window_s, t0),
        ("after", t1, min(t1 + window_s, a.end - h)),
    ):
        sel = (a.t_arrival >= lo) & (a.t_arrival < hi)
        picked.append(sel)
        finished = (a.t_done >= lo) & (a.t_done < hi)
        n = int(sel.sum())
        rows.append(
            {
                "period": period,
                "arrivals": n,
                "in_flight": int((sel & ~np.isfinite(a.e2e)).sum()) if a.in_flight_known else None,
                "ttft_mean_s": float(ttft[sel].mean()) if n else None,
                "ttft_p95_s": float(np.percentile(ttft[sel], 95)) if n else None,
                "e2e_mean_s": float(e2e[sel].mean()) if n else None,
                "e2e_p95_s": float(np.percentile(e2e[sel], 95)) if n else None,
                "capped": int((sel & (e2e >= h)).sum()),
                "throughput_rps": int(finished.sum()) / (hi - lo) if hi > lo else None,
                "from_s": lo,
                "to_s": hi,
            }
        )
    rng = np.random.default_rng(seed)
    b, af = picked
    change: dict[str, Any] = {"period": "after - before"}
    for name, values in (("ttft_mean_s", ttft), ("e2e_mean_s", e2e)):
        x, y = rows[0][name], rows[1][name]
        change[name] = None if x is None or y is None else y - x
        change[name.replace("_s", "_ci95")] = list(_diff_ci(values[b], values[af], rng))
    out = pl.DataFrame([*rows, change], infer_schema_length=None)
    cols = ["period", "arrivals", "in_flight", "ttft_mean_s", "ttft_mean_ci95", "e2e_mean_s",
            "e2e_mean_ci95", "ttft_p95_s", "e2e_p95_s", "capped", "throughput_rps", "from_s",
            "to_s"]  # fmt: skip
    return out.select(cols).with_columns(
        pl.lit(h).alias("horizon_s"),
        pl.lit(a.end).alias("data_end_s"),
        pl.lit(int(sw["node_id"])).alias("node_id"),
        pl.lit(f"{sw['from_phase']} -> {sw['to_phase']}").alias("switch"),
        pl.lit(sw["trigger"]).alias("trigger"),
    )


def switch_effect_figure(
    reader: Any,
    run_id: str,
    node_id: int | None = None,
    bin_s: float = 10.0,
    horizon_s: float | None = None,
    window_s: float = 120.0,
) -> go.Figure:
    """Mean TTFT and E2E (capped at H, requests in flight counted) per arrival bin, with
    the switch shaded and the arrivals too recent to compare marked."""
    sw = _switch(reader, run_id, node_id)
    a = _arrivals(reader, run_id)
    h = horizon_s if horizon_s is not None else _horizon(a, float(sw["t_decided"]), window_s)
    df = pl.DataFrame(
        {
            "t": np.floor(a.t_arrival / bin_s) * bin_s,
            "ttft_s": _capped(a.ttft, a.t_arrival, a.end, h),
            "e2e_s": _capped(a.e2e, a.t_arrival, a.end, h),
        }
    )
    df = df.filter(pl.col("t") < a.end - h).group_by("t").agg(pl.all().mean()).sort("t")
    fig = go.Figure()
    fig.add_scatter(x=df["t"].to_list(), y=df["ttft_s"].to_list(), name="mean TTFT", mode="lines")
    fig.add_scatter(x=df["t"].to_list(), y=df["e2e_s"].to_list(), name="mean E2E", mode="lines")
    fig.add_vrect(
        x0=sw["t_decided"],
        x1=max(sw["t_done"], sw["t_decided"] + 1e-6),
        fillcolor="orange",
        opacity=0.3,
        line_width=0,
    )
    fig.add_vrect(
        x0=max(a.end - h, 0.0),
        x1=a.end,
        fillcolor="grey",
        opacity=0.15,
        line_width=0,
        annotation_text="too recent to compare",
    )
    fig.add_vline(
        x=sw["t_decided"],
        line_dash="dash",
        annotation_text=f"node {sw['node_id']} {sw['from_phase']} → {sw['to_phase']} "
        f"({sw['trigger']})",
    )
    return style(
        fig.update_yaxes(title_text="mean latency (s)", rangemode="tozero").update_xaxes(
            title_text=f"arrival time, {float(bin_s):g}-s bins (s since run start)"
        ),
        f"Latency around the switch of node {sw['node_id']}",
        run_id,
        f"capped at {h:.3g} s, requests in flight counted; orange: from the decision to the "
        "node serving its new phase",
        height=380,
    )
