"""Logs written by another program: a DuckDB with some of the documented tables and columns
(requests and iterations, no nodes, no KV tables, no run config, nullable times unset).
Every figure either says why it is empty or draws every panel, and a panel without data
says why instead of staying blank."""

from __future__ import annotations

from pathlib import Path

import duckdb
import plotly.graph_objects as go
import pytest

from toolkit.plots import FIGURES, is_empty
from toolkit.plots.common import PANEL_MESSAGE

# name -> (tables copied from the simulated run, requests columns set to NULL)
VARIANTS = {
    "iterations-and-requests": (
        ("runs", "requests", "prefill_iterations", "decode_iterations"),
        ("t_ideal_c",),
    ),
    "requests-without-prefill-times": (
        ("runs", "nodes", "requests", "decode_iterations"),
        ("t_ideal_c", "t_prefill_start", "prefill_node", "t_first_token"),
    ),
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def foreign_db(request, sim_run, tmp_path_factory) -> Path:
    tables, nulls = VARIANTS[request.param]
    db = tmp_path_factory.mktemp("foreign") / f"{request.param}.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute(f"ATTACH '{sim_run.db}' AS sim (READ_ONLY)")
        for table in tables:
            con.execute(f"CREATE TABLE {table} AS SELECT * FROM sim.{table}")
        con.execute("UPDATE runs SET config = NULL, source = 'other-engine'")
        con.execute(f"UPDATE requests SET {', '.join(f'{c} = NULL' for c in nulls)}")
    return db


def _panels(fig: go.Figure) -> list[tuple[str, str, tuple[float, float], tuple[float, float]]]:
    """(x axis, y axis, x domain, y domain) of every subplot (overlaid axes aside)."""
    layout = fig.to_plotly_json()["layout"]
    out = []
    for key, axis in layout.items():
        if not key.startswith("xaxis") or not isinstance(axis, dict):
            continue
        x = "x" + key[len("xaxis") :]
        y = axis.get("anchor", "y" + key[len("xaxis") :])
        yaxis = layout.get("yaxis" + y[1:], {})
        out.append((x, y, tuple(axis.get("domain", (0, 1))), tuple(yaxis.get("domain", (0, 1)))))
    return out


def _drawn(fig: go.Figure, x: str, y: str) -> bool:
    """A trace with data on the subplot (or on an axis overlaying its y axis)."""
    layout = fig.to_plotly_json()["layout"]
    ys = {y} | {
        "y" + k[len("yaxis") :]
        for k, v in layout.items()
        if k.startswith("yaxis") and isinstance(v, dict) and v.get("overlaying") == y
    }
    for t in fig.data:
        on = (getattr(t, "xaxis", None) or "x", getattr(t, "yaxis", None) or "y")
        values = [getattr(t, a, None) for a in ("x", "y", "z", "q1")]
        if on[0] == x and on[1] in ys and any(v is not None and len(v) for v in values):
            return True
    return False


def _message_in(fig: go.Figure, xd: tuple[float, float], yd: tuple[float, float]) -> str | None:
    for a in fig.layout.annotations:
        if a.name == PANEL_MESSAGE and xd[0] <= a.x <= xd[1] and yd[0] <= a.y <= yd[1]:
            return str(a.text)
    return None


@pytest.mark.parametrize("name", list(FIGURES))
def test_no_blank_panel_on_foreign_logs(foreign_db, name):
    fig = FIGURES[name](foreign_db)
    if is_empty(fig):
        assert fig.layout.annotations[0].text.startswith("no ")
        return
    blank = [
        (x, y)
        for x, y, xd, yd in _panels(fig)
        if not _drawn(fig, x, y) and _message_in(fig, xd, yd) is None
    ]
    assert not blank, f"{name}: panels without data and without a word why: {blank}"


def test_the_messages_name_the_missing_columns(foreign_db):
    fig = FIGURES["reuse"](foreign_db)
    messages = [a.text for a in fig.layout.annotations if a.name == PANEL_MESSAGE]
    if foreign_db.stem == "iterations-and-requests":
        assert messages == ["t_ideal_c not logged:<br>h* and lost KV reuse unknown"]
        return
    assert is_empty(fig)  # no request logged a prefill start: nothing to compute h from
    load = FIGURES["load"](foreign_db)
    messages = [a.text for a in load.layout.annotations if a.name == PANEL_MESSAGE]
    assert len(messages) == 2 and all("t_prefill_start" in m for m in messages)
    latency = FIGURES["latency"](foreign_db)
    ttft, tpot = [a.text for a in latency.layout.annotations if a.name == PANEL_MESSAGE]
    assert "t_first_token" in ttft and "t_first_token" in tpot
    # Unlogged first-token times are not counted as TTFTs (or TPOTs) of zero.
    assert {t.meta["metric"] for t in latency.data} == {"e2e"}
