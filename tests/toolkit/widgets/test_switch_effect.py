"""Notebook 04's before/after of a switch is unbiased on a run whose switch changes nothing,
with requests still in flight at the data's end (right-censoring)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from telemetry import TelemetryWriter, open_reader
from toolkit.widgets.switch_effect import switch_effect, switch_effect_figure

END_S = 560.0  # the data's end: the run is still being written
SWITCH_S = 300.0


def _stationary_run(db: Path, seed: int) -> None:
    """Poisson arrivals at 1/s, heavy-tailed E2E (lognormal, median 15 s), the same before
    and after a switch at 300 s that changes nothing; requests not done by 560 s have a
    router decision but no `requests` row, as in a run still being written."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0, 700))
    t = t[t < END_S]
    e2e = rng.lognormal(np.log(15.0), 1.0, t.size)
    ttft = e2e * rng.uniform(0.05, 0.3, t.size)
    done = t + e2e <= END_S
    ids = [f"r{i}" for i in range(t.size)]
    with TelemetryWriter(db, run_id="run", source="sim") as w:
        w.add_nodes(
            [{"node_id": i, "name": f"n{i}", "hardware": "x", "moe_top_k": 0, "moe_experts": 0}
             for i in range(2)]
        )  # fmt: skip
        w.append(
            "router_decisions",
            {"t": t.tolist(), "request_id": ids, "node_id": [0] * t.size,
             "policy": ["rr"] * t.size, "predicted_ttft_s": [None] * t.size,
             "cached_tokens": [0] * t.size, "fetch_tokens": [0] * t.size},
        )  # fmt: skip
        k = np.flatnonzero(done)
        w.append(
            "requests",
            {"request_id": [ids[i] for i in k], "program_id": [ids[i] for i in k],
             "branch_id": [ids[i] for i in k], "t_arrival": t[k].tolist(),
             "prefill_node": [0] * k.size, "decode_node": [1] * k.size, "t_in": [100] * k.size,
             "t_c": [0] * k.size, "t_fetch": [0] * k.size, "t_out": [50] * k.size,
             "t_first_token": (t[k] + ttft[k]).tolist(), "t_done": (t[k] + e2e[k]).tolist()},
        )  # fmt: skip
        w.append(
            "phase_switches",
            {"node_id": [1], "t_decided": [SWITCH_S], "t_done": [SWITCH_S + 2.0],
             "from_phase": ["decode"], "to_phase": ["prefill"], "trigger": ["manual"],
             "drained": [0], "lost_kv_blocks": [0]},
        )  # fmt: skip


@pytest.mark.parametrize("seed", [1, 2])
def test_a_switch_with_no_effect_shows_none(tmp_path: Path, seed: int) -> None:
    db = tmp_path / "run.duckdb"
    _stationary_run(db, seed)
    reader = open_reader(db)
    df = switch_effect(reader, "run", node_id=1, window_s=250.0)
    before, after, change = df.rows(named=True)
    assert (before["period"], after["period"], change["period"]) == (
        "before",
        "after",
        "after - before",
    )
    h = before["horizon_s"]
    end = before["data_end_s"]  # the latest time the rows record
    assert END_S - 5 < end <= END_S and 10 < h <= 125 and after["to_s"] == pytest.approx(end - h)
    # requests in flight are counted, their latency capped at H like every other
    assert after["in_flight"] > 0 and after["capped"] > 0
    for name in ("ttft_mean_s", "e2e_mean_s"):
        lo, hi = change[name.replace("_s", "_ci95")]
        assert lo <= 0.0 <= hi, (name, change[name], lo, hi)
        assert before[name] == pytest.approx(after[name], rel=0.25)
    # the latency columns are there, in the order a narrow display shows first
    assert df.columns[:7] == [
        "period", "arrivals", "in_flight", "ttft_mean_s", "ttft_mean_ci95", "e2e_mean_s",
        "e2e_mean_ci95",
    ]  # fmt: skip
    # what the fix is for: finished requests only, over the window up to the data's end,
    # make "after" look faster than the interval allows
    req = reader.sql("SELECT t_arrival, t_done - t_arrival AS e2e FROM requests")
    t, e2e = req["t_arrival"].to_numpy(), req["e2e"].to_numpy()
    naive_before = e2e[(t >= SWITCH_S - 250) & (t < SWITCH_S)].mean()
    naive_after = e2e[(t >= SWITCH_S + 2) & (t < END_S)].mean()
    assert naive_after - naive_before < change["e2e_mean_ci95"][0]
    fig = switch_effect_figure(reader, "run", node_id=1, window_s=250.0)
    assert max(fig.data[1].x) < end - h  # bins too recent to compare are left out
