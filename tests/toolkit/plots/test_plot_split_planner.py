"""PD split over time and planner gains: the figures replay phase_switches and planner_windows."""

from __future__ import annotations

import itertools
import math

import duckdb
import numpy as np
import pytest

from toolkit.plots import pd_split, planner_gains
from toolkit.queries.planner import gain_threshold


def _rows(db, sql: str) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql).fetchall()


def _trace(fig, name):
    (tr,) = [t for t in fig.data if t.name == name]
    return tr


def test_split_ends_in_the_state_the_switches_leave(sim_run):
    fig = pd_split(sim_run.db, sim_run.run_id)
    switches = _rows(
        sim_run.db,
        f"SELECT node_id, t_decided, to_phase FROM phase_switches "
        f"WHERE run_id = '{sim_run.run_id}' ORDER BY t_done",
    )
    assert len(switches) == sim_run.summary["switches"] >= 2
    phases = {0: "prefill", 1: "prefill", 2: "prefill", 3: "decode"}  # 3P1D, first ids prefill
    for node, _, to in switches:
        phases[node] = to
    prefill, decode = _trace(fig, "prefill nodes"), _trace(fig, "decode nodes")
    final = (prefill.y[-1], decode.y[-1])
    assert final == (
        sum(p == "prefill" for p in phases.values()),
        sum(p == "decode" for p in phases.values()),
    )
    assert f"{final[0]}P{final[1]}D" == sim_run.summary["final_split"]
    assert prefill.x[-1] == 400.0
    # The gain planner's warmup is collocated: all 4 nodes until 100 s, then the 3P1D split.
    colloc = _trace(fig, "collocated nodes")
    assert (colloc.x[0], colloc.y[0]) == (0.0, 4)
    assert (prefill.y[list(prefill.x).index(100.0)], decode.y[list(decode.x).index(100.0)]) == (
        3,
        1,
    )
    markers = _trace(fig, "phase switch (decided)")
    assert sorted(markers.x) == sorted(t for _, t, _ in switches)


def test_each_node_has_contiguous_phase_bands_over_the_run(sim_run):
    fig = pd_split(sim_run.db, sim_run.run_id)
    bands: dict[str, list[tuple[float, float, str]]] = {}
    for tr in (t for t in fig.data if t.type == "bar"):
        for y, base, width in zip(tr.y, tr.base, tr.x, strict=True):
            bands.setdefault(y, []).append((base, base + width, tr.name))
    assert sorted(bands) == [f"node-{n}" for n in range(4)]
    for segs in bands.values():
        segs.sort()
        assert segs[0][0] == 0.0 and segs[-1][1] == pytest.approx(400.0)
        assert all(a[1] == pytest.approx(b[0]) for a, b in itertools.pairwise(segs))
        assert segs[0][2] == "collocated"


def test_planner_bars_are_mean_gains_with_two_sigma_over_root_m(sim_run):
    fig = planner_gains(sim_run.db, sim_run.run_id)
    rows = _rows(
        sim_run.db,
        f"SELECT t, candidate_prefill, mean_gain, std_gain, slices, qualified, chosen "
        f"FROM planner_windows WHERE run_id = '{sim_run.run_id}' ORDER BY t, candidate_prefill",
    )
    assert rows
    bars = {t.name: t for t in fig.data if t.type == "bar"}
    assert set(bars) == {f"{c} prefill nodes" for c in {r[1] for r in rows}}
    for name, tr in bars.items():
        cand = int(name.split()[0])
        mine = [r for r in rows if r[1] == cand]
        assert list(tr.x) == [f"{r[0]:g}" for r in mine]
        np.testing.assert_allclose(tr.y, [r[2] for r in mine])
        np.testing.assert_allclose(
            tr.error_y.array, [2 * r[3] / math.sqrt(r[4]) for r in mine], rtol=1e-12
        )
        assert list(tr.marker.line.width) == [3 if r[6] else 1 for r in mine]
        assert list(tr.marker.pattern.shape) == ["" if r[5] else "/" for r in mine]
    # A qualified candidate's whisker stays above zero (Eq. 6), an unqualified one's does not.
    for tr in bars.values():
        for y, e, shape in zip(tr.y, tr.error_y.array, tr.marker.pattern.shape, strict=True):
            assert (y - e > 0) == (shape == "")


def test_gain_threshold():
    assert gain_threshold(0.5, 4) == pytest.approx(0.5)
    assert gain_threshold(0.5, 0) == 0.0
