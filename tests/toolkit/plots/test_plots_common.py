"""Contract of every figure function: data on a real run, a message on empty tables, clear
errors for a bad database or run, and reading a run that is still being written."""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go
import pytest

from telemetry import TelemetryError, TelemetryWriter, open_reader
from toolkit.plots import FIGURES, is_empty, latency_distributions
from toolkit.queries.run import time_bin_width

EMPTY_MESSAGES = {
    "split": "no nodes or phase switches",  # the empty run has nodes: see the test below
    "latency": "no finished requests",
    "queue": "no finished requests or recorded engine series",
    "timeline": "no prefill or decode passes logged",
    "reuse": "no requests that started prefill",
    "load": "no iterations or prefilled requests",
    "planner": "no planner windows logged",
    "prefill_fit": "no prefill iterations logged",
    "decode_fit": "no decode iterations logged",
    "eviction": "no evictions logged",
    "counts": "no branch counts logged",
    "count_tree": "no branch counts logged",
}


def _points(trace: go.BaseTraceType) -> int:
    for attr in ("z", "y", "x", "q1"):
        value = getattr(trace, attr, None)
        if value is not None and len(value) > 0:
            return len(value)
    return 0


def _axis_titles(fig: go.Figure, letter: str) -> list[str]:
    layout = fig.to_plotly_json()["layout"]
    return [
        v["title"]["text"]
        for k, v in layout.items()
        if k.startswith(f"{letter}axis") and isinstance(v, dict) and v.get("title", {}).get("text")
    ]


@pytest.mark.parametrize("name", list(FIGURES))
def test_every_figure_has_data_and_titled_axes(sim_run, name):
    # Half the figures get a path, half a reader: both are accepted.
    source = sim_run.db if list(FIGURES).index(name) % 2 else open_reader(sim_run.db)
    fig = FIGURES[name](source, sim_run.run_id)
    assert isinstance(fig, go.Figure)
    assert not is_empty(fig), fig.layout.meta
    assert sum(_points(t) for t in fig.data) > 0
    assert fig.layout.title.text.startswith(fig.layout.meta["pdlab_title"])
    assert sim_run.run_id in fig.layout.title.text
    assert _axis_titles(fig, "x") and _axis_titles(fig, "y")


@pytest.mark.parametrize("name", [n for n in FIGURES if n != "phi"])
def test_empty_tables_give_an_annotated_figure(empty_run, name):
    if name == "split":
        # Nodes exist but never switched and logged nothing: still one phase band each.
        fig = FIGURES[name](empty_run.db)
        assert {t.name for t in fig.data} >= {"unknown nodes"}
        return
    fig = FIGURES[name](empty_run.db)  # the only run: run_id may be omitted
    assert is_empty(fig)
    text = fig.layout.annotations[0].text
    assert EMPTY_MESSAGES[name] in text
    if name in ("planner", "eviction", "counts", "count_tree", "prefill_fit", "decode_fit"):
        assert "empty-run" in text
    assert len(fig.data) == 0


def test_phi_needs_only_the_nodes_table(empty_run):
    fig = FIGURES["phi"](empty_run.db)
    (curve,) = fig.data
    assert curve.meta["top_k"] == 8 and curve.meta["num_experts"] == 256


def test_missing_database_and_unknown_run_are_clear_errors(sim_run, tmp_path):
    with pytest.raises(TelemetryError, match="no telemetry at"):
        FIGURES["latency"](tmp_path / "missing.duckdb")
    with pytest.raises(TelemetryError, match=f"unknown run 'nope'.*{sim_run.run_id}"):
        FIGURES["latency"](sim_run.db, "nope")
    with pytest.raises(TelemetryError, match="expected a database path or a telemetry reader"):
        FIGURES["latency"](42)


def _nodes(writer: TelemetryWriter) -> None:
    writer.add_nodes(
        {
            "node_id": [0],
            "name": ["n0"],
            "hardware": ["x"],
            "moe_top_k": [8],
            "moe_experts": [256],
        }
    )


def _requests(n: int, t0: float = 0.0) -> dict[str, list]:
    return {
        "request_id": [f"r{i}" for i in range(n)],
        "program_id": ["p"] * n,
        "branch_id": ["root"] * n,
        "t_arrival": [t0 + i for i in range(n)],
        "prefill_node": [0] * n,
        "decode_node": [0] * n,
        "t_in": [1000] * n,
        "t_c": [500] * n,
        "t_fetch": [0] * n,
        "t_out": [10] * n,
        "t_prefill_start": [t0 + i + 0.1 for i in range(n)],
        "t_first_token": [t0 + i + 0.2 for i in range(n)],
        "t_done": [t0 + i + 1.0 for i in range(n)],
        "t_ideal_c": [600] * n,
    }


def test_several_runs_need_a_run_id(tmp_path: Path):
    db = tmp_path / "two.duckdb"
    for rid in ("a", "b"):
        with TelemetryWriter(db, run_id=rid, source="test") as w:
            _nodes(w)
            w.append("requests", _requests(3))
    with pytest.raises(TelemetryError, match="holds 2 runs; choose one of: a, b"):
        FIGURES["latency"](db)
    fig = FIGURES["latency"](db, "b")
    assert fig.data[0].meta["requests"] == 3


def test_a_run_being_written_is_readable(tmp_path: Path):
    db = tmp_path / "live.duckdb"
    w = TelemetryWriter(db, run_id="live", source="live-sim")
    try:
        _nodes(w)
        w.append("requests", _requests(5))
        w.flush()  # a live Parquet segment; the DB holds only the runs and nodes rows
        fig = latency_distributions(db, "live")
        assert fig.data[0].meta["requests"] == 5
        later = _requests(4, t0=10.0) | {"request_id": [f"s{i}" for i in range(4)]}
        w.append("requests", later)
        w.flush()
        assert latency_distributions(db, "live").data[0].meta["requests"] == 9
    finally:
        w.close()
    assert latency_distributions(db, "live").data[0].meta["requests"] == 9


def test_time_bins_are_round():
    assert time_bin_width(400, 40) == 10
    assert time_bin_width(3600, 100) == 50
    assert time_bin_width(600, 7) == 100
    with pytest.raises(ValueError, match="bins must be >= 1"):
        time_bin_width(10, 0)
