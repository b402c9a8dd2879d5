"""The per-node iteration timeline (Gantt) on the session's simulated PD run: the window
query returns every pass with its requests as the tables say (checked by direct SQL and
Python, no plotly), downsamples a window above its limit, and the figure draws one bar per
pass whose hover names its requests."""

from __future__ import annotations

import duckdb
import polars as pl
import pytest

from toolkit.plots.timeline import draw_pass_window, pass_timeline
from toolkit.queries import open_run
from toolkit.queries.timeline import DEFAULT_PASSES, busy_overview, default_window, pass_window


def _sql(db, sql: str, params=()) -> pl.DataFrame:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.sql(sql, params=list(params) or None).pl()


@pytest.fixture(scope="module")
def window(sim_run) -> tuple[float, float]:
    with open_run(sim_run.db) as run:
        return default_window(run)


def test_the_default_window_is_a_few_hundred_passes_after_the_warmup(sim_run, window):
    t0, t1 = window
    n = _sql(
        sim_run.db,
        "SELECT (SELECT count(*) FROM prefill_iterations WHERE t_start >= ? AND t_start < ?)"
        " + (SELECT count(*) FROM decode_iterations WHERE t_start >= ? AND t_start < ?) AS n",
        [t0, t1, t0, t1],
    )["n"][0]
    assert t0 >= 100.0  # the warmup of the session's run
    assert DEFAULT_PASSES / 3 <= n <= 3 * DEFAULT_PASSES


def test_every_pass_with_its_requests(sim_run, window):
    t0, t1 = window
    with open_run(sim_run.db) as run:
        w = pass_window(run, t0, t1, max_ids=1000)
    assert w.exact and w.missing is None
    pre = _sql(
        sim_run.db, "SELECT * FROM prefill_iterations WHERE t_start >= ? AND t_start < ?", [t0, t1]
    )
    dec = _sql(
        sim_run.db, "SELECT * FROM decode_iterations WHERE t_start >= ? AND t_start < ?", [t0, t1]
    )
    assert w.total == w.passes.height == pre.height + dec.height > 0
    got = {(r["node_id"], r["phase"], r["iter_id"]): r for r in w.passes.iter_rows(named=True)}
    members = _sql(
        sim_run.db, "SELECT node_id, iter_id, request_id, t_uc FROM prefill_iteration_requests"
    )
    for p in pre.iter_rows(named=True):
        g = got[(p["node_id"], "prefill", p["iter_id"])]
        mine = members.filter(
            (pl.col("node_id") == p["node_id"]) & (pl.col("iter_id") == p["iter_id"])
        )
        assert g["n_requests"] == p["num_reqs"] == mine.height and g["requests_from"] == "logged"
        assert sorted(zip(g["request_ids"], g["request_tokens"], strict=True)) == sorted(
            mine.select("request_id", "t_uc").iter_rows()
        )
        assert sum(g["request_tokens"]) == p["t_uc"] == g["tokens"]
    reqs = _sql(sim_run.db, "SELECT request_id, decode_node, t_first_token, t_done FROM requests")
    sizes = []
    for d in dec.iter_rows(named=True):
        g = got[(d["node_id"], "decode", d["iter_id"])]
        t = d["t_start"]
        want = reqs.filter(
            (pl.col("decode_node") == d["node_id"])
            & (pl.col("t_first_token") <= t)
            & (pl.col("t_done") > t)
        )
        assert sorted(g["request_ids"] or []) == sorted(want["request_id"].to_list())
        assert g["n_requests"] == want.height and g["size"] == d["batch_size"]
        sizes.append((g["n_requests"], d["batch_size"]))
    # Request times rebuild the logged batches up to a request whose KV is still in flight
    # (first token out, not yet decoding) or that never finished (not in `requests`).
    assert all(abs(n - b) <= 1 for n, b in sizes)
    assert sum(n == b for n, b in sizes) >= 0.9 * len(sizes)


def test_a_large_window_is_downsampled_and_keeps_the_busy_time(sim_run):
    with open_run(sim_run.db) as run:
        w = pass_window(run, 0.0, 400.0, max_passes=500, bins=50)
        overview, width = busy_overview(run, bins=50)
        with pytest.raises(ValueError, match="must end after it starts"):
            pass_window(run, 10.0, 5.0)
    assert not w.exact and w.passes.is_empty() and w.width_s == 10.0 and width == 10.0
    total = _sql(
        sim_run.db,
        "SELECT (SELECT count(*) FROM prefill_iterations) + (SELECT count(*) FROM decode_iterations) n",
    )["n"][0]
    assert w.total == total == w.bins["passes"].sum() == overview["passes"].sum()
    busy = _sql(
        sim_run.db,
        "SELECT node_id, floor(t_start / 10) * 10 AS t_bin, sum(duration_s) / 10 AS busy "
        "FROM decode_iterations GROUP BY ALL",
    )
    got = w.bins.filter(pl.col("phase") == "decode").join(busy, on=["node_id", "t_bin"])
    assert got.height == busy.height
    assert (got["busy"] - got["busy_right"].clip(upper_bound=1.0)).abs().max() < 1e-9


def test_the_figure_draws_each_pass_and_names_its_requests(sim_run, window):
    fig = pass_timeline(sim_run.db, sim_run.run_id)
    bars = [t for t in fig.data if t.type == "bar"]
    with open_run(sim_run.db) as run:
        w = pass_window(run, *window)
    assert sum(len(b.x) for b in bars) == w.passes.height
    assert [t.type for t in fig.data].count("heatmap") == 1  # the whole run's overview
    assert fig.layout.shapes[0].x0 == pytest.approx(window[0])
    named = w.passes.filter(pl.col("n_requests") > 0).row(0, named=True)
    (bar,) = [b for b in bars if b.meta["phase"] == named["phase"]]
    text = "".join(bar.hovertext)
    assert named["request_ids"][0] in text and "ms" in text
    coarse = draw_pass_window(pass_window_of(sim_run, 0.0, 400.0, max_passes=100))
    assert [t.type for t in coarse.data] == [
        "heatmap"
    ] and "busy share per" in coarse.layout.title.text


def pass_window_of(sim_run, t0, t1, **kw):
    with open_run(sim_run.db) as run:
        return pass_window(run, t0, t1, **kw)
