"""The effect of one phase switch on latency, read from telemetry (paper 000 §4.2, SPEC §3).

For a switch decided at t_decided and completed at t_done, compares the requests that
arrived in the `window_s` before the decision with those that arrived in the `window_s`
after completion (clipped to the data written so far, so it works on a run still being
written): count, TTFT and E2E (mean, P95), and completed throughput. The figure bins the
same requests over time and shades the switch.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
import polars as pl

from toolkit.plots.common import style

_LATENCY = "t_first_token - t_arrival AS ttft_s, t_done - t_arrival AS e2e_s, t_arrival, t_done"


def _switch(reader: Any, run_id: str, node_id: int | None) -> dict[str, Any]:
    where = "run_id = ?" + (" AND node_id = ?" if node_id is not None else "")
    params: list[Any] = [run_id] + ([node_id] if node_id is not None else [])
    df = reader.sql(f"SELECT * FROM phase_switches WHERE {where} ORDER BY t_done DESC", params)
    if df.is_empty():
        who = "" if node_id is None else f" of node {node_id}"
        raise LookupError(
            f"run {run_id!r} has no completed phase switch{who} yet "
            "(a switch is logged when the node serves its new phase)"
        )
    return df.row(0, named=True)


def switch_effect(
    reader: Any, run_id: str, node_id: int | None = None, window_s: float = 120.0
) -> pl.DataFrame:
    """Before/after latency of the latest completed switch (of `node_id`, or of any node)."""
    sw = _switch(reader, run_id, node_id)
    t0, t1 = float(sw["t_decided"]), float(sw["t_done"])
    reqs = reader.sql(
        f"SELECT {_LATENCY} FROM requests WHERE run_id = ? AND t_done IS NOT NULL", [run_id]
    )
    end = float(reqs["t_done"].max()) if reqs.height else t1
    rows = []
    for period, lo, hi in (("before", t0 - window_s, t0), ("after", t1, min(t1 + window_s, end))):
        sel = reqs.filter((pl.col("t_arrival") >= lo) & (pl.col("t_arrival") < hi))
        done = reqs.filter((pl.col("t_done") >= lo) & (pl.col("t_done") < hi)).height
        rows.append(
            {
                "period": period,
                "from_s": lo,
                "to_s": hi,
                "requests": sel.height,
                "ttft_mean_s": sel["ttft_s"].mean(),
                "ttft_p95_s": sel["ttft_s"].quantile(0.95),
                "e2e_mean_s": sel["e2e_s"].mean(),
                "e2e_p95_s": sel["e2e_s"].quantile(0.95),
                "throughput_rps": done / (hi - lo) if hi > lo else None,
            }
        )
    out = pl.DataFrame(rows)
    return out.with_columns(
        pl.lit(int(sw["node_id"])).alias("node_id"),
        pl.lit(f"{sw['from_phase']} -> {sw['to_phase']}").alias("switch"),
        pl.lit(sw["trigger"]).alias("trigger"),
    )


def switch_effect_figure(
    reader: Any, run_id: str, node_id: int | None = None, bin_s: float = 10.0
) -> go.Figure:
    """Mean TTFT and E2E per arrival bin over the run, with the switch shaded."""
    sw = _switch(reader, run_id, node_id)
    df = reader.sql(
        f"SELECT floor(t_arrival / {float(bin_s)}) * {float(bin_s)} AS t, "
        "avg(t_first_token - t_arrival) AS ttft_s, avg(t_done - t_arrival) AS e2e_s, "
        "count(*) AS requests FROM requests WHERE run_id = ? AND t_done IS NOT NULL "
        "GROUP BY 1 ORDER BY 1",
        [run_id],
    )
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
        "shaded: from the decision to the node serving its new phase",
        height=380,
    )
