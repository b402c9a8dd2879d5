"""`pdlab advise`: splits ranked on workloads whose answer is known, the JSON shape, switch
costs, the oscillation flag on a run whose windows alternate, the twin's error in the
intervals, and bad input. Three-node runs of a few dozen requests on the h200 preset."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats
from typer.testing import CliRunner

from toolkit.advise.run import METRICS, advise
from toolkit.advise.workload import _split, load_run, prefix_hashes
from toolkit.cli import app
from toolkit.importers import BenchRun, write_runs

runner = CliRunner()
LONG = 16_000  # tokens: ~0.75 s of prefill on h200, so one prefill node queues at 2 req/s


def _run(
    run_id: str,
    requests: list[tuple[float, int, int]],
    *,
    config: dict[str, Any] | None = None,
    source: str = "test",
    stretch: float = 1.0,
) -> BenchRun:
    """A 3-node run; recorded TTFT 0.5 s and E2E `stretch` s per request."""
    run = BenchRun(
        run_id, datetime(2026, 1, 1, tzinfo=UTC), source, config or {}, ["n0", "n1", "n2"], "t"
    )
    for i, (t, t_in, t_out) in enumerate(requests):
        run.add_request(
            request_id=f"r{i}", program_id=f"r{i}", branch_id=f"r{i}", t_arrival=t,
            prefill_node=None, decode_node=None, t_in=t_in, t_c=0, t_fetch=0, t_out=t_out,
            t_first_token=t + 0.5, t_done=t + stretch,
        )  # fmt: skip
    return run


def _alternating() -> list[tuple[float, int, int]]:
    """Prefill-heavy for 10 s, decode-heavy for 10 s, prefill-heavy for 10 s."""
    long_prompts = [(k * 10 / 16, LONG, 4) for k in range(16)]
    decodes = [(10 + k * 10 / 80, 64, 500) for k in range(80)]
    return [*long_prompts, *decodes, *((t + 20, i, o) for t, i, o in long_prompts)]


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("advise") / "runs.duckdb"
    alternating = _alternating()
    write_runs(
        path,
        [
            _run("prefill", [(k * 0.5, LONG, 4) for k in range(20)]),
            _run(
                "alternating",
                alternating,
                config={"split": "1P2D", "nodes": 3, "profile": "h200", "planner": "gain"},
            ),
            _run(
                "twin-alternating",
                alternating,
                config={"twin_of": "alternating"},
                source="twin",
                stretch=1.1,
            ),
            _run("empty", [(0.0, 0, 4)]),
            _run("unsent", [(0.0, 100, 4)], config={"arrivals": "unknown"}),
        ],
    )
    return path


@pytest.fixture(scope="module")
def alternating(db: Path) -> dict[str, Any]:
    args = ["advise", str(db), "--run", "alternating", "--seeds", "2", "--window", "10"]
    res = runner.invoke(app, [*args, "--twin", "twin-alternating", "--json"])
    assert res.exit_code == 0, res.output
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


def test_prefill_heavy_requests_rank_more_prefill_nodes_first(db: Path) -> None:
    result = advise(load_run(db, "prefill"), profile="h200", seeds=2, collocated=False)
    assert [s.split for s in result.splits] == ["2P1D", "1P2D"]
    best, worst = result.splits
    # one prefill node queues 20 long prompts at 2/s (~0.75 s each): TTFT grows to seconds
    assert best.metrics["ttft_mean_s"].mean < 1.0 < worst.metrics["ttft_mean_s"].mean
    assert result.current is None and all(s.switch is None for s in result.splits)
    assert result.recommendation.split == "2P1D"
    assert "no switch cost" in result.recommendation.reason
    assert result.interval == "seeds" and result.twin_run_id is None


def test_json_shape_and_switch_cost(alternating: dict[str, Any]) -> None:
    doc = alternating
    assert doc["run_id"] == "alternating" and doc["nodes"] == 3 and doc["requests"] == 112
    assert doc["current_split"] == "1P2D" and doc["seeds"] == 2 and doc["rank_by"] == "e2e_mean_s"
    splits = {s["split"]: s for s in doc["splits"]}
    assert [s["rank"] for s in doc["splits"]] == [1, 2, 3]
    assert set(splits) == {"1P2D", "2P1D", "3 collocated"}
    for s in doc["splits"]:
        assert set(s["metrics"]) == set(METRICS) and s["unfinished_requests"] == 0
        for m in s["metrics"].values():
            assert len(m["seeds"]) == 2
            assert m["ci95"][0] <= m["mean"] <= m["ci95"][1]
    assert splits["1P2D"]["switch"] is None  # the run's own split
    # the same nodes as collocated engines, ranked with the same intervals; a move from a
    # PD split to them relaunches every engine: no switch cost is modelled
    col = splits["3 collocated"]
    assert col["collocated"] and (col["prefill"], col["decode"]) == (0, 0)
    assert col["switch"] is None and set(col["metrics"]) == set(METRICS)
    assert not splits["1P2D"]["collocated"]
    sw = splits["2P1D"]["switch"]
    assert sw["from"] == "1P2D" and sw["mode"] == "in-place" and sw["nodes_moved"] == 1
    assert sw["t_switch_s"] == pytest.approx(10.0)  # the end of the first window
    assert sw["switch_time_s"] >= 0 and sw["lost_kv_blocks"] == 0  # in place: KV kept
    assert sw["switch_finished"] is True
    assert set(sw["metrics"]) == set(METRICS)
    rec = doc["recommendation"]
    assert (
        rec["split"] in splits
        and rec["stay_value"] == splits["1P2D"]["metrics"]["e2e_mean_s"]["mean"]
    )
    # the recorded run ran on 1P2D: its own metrics come along (E2E 1 s per request)
    assert doc["recorded"]["e2e_mean_s"] == pytest.approx(1.0)


def test_windows_that_alternate_are_flagged(alternating: dict[str, Any]) -> None:
    w = alternating["windows"]
    assert w["window_s"] == 10.0 and len(w["best"]) == 3
    # long prompts want every node prefilling (collocated engines; two prefill nodes next),
    # long decodes two decode nodes
    best = [b["best"] for b in w["best"]]
    assert best == ["3 collocated", "1P2D", "3 collocated"]
    first = w["best"][0]["values"]
    assert first["3 collocated"] <= first["2P1D"] < first["1P2D"]
    assert w["pattern"] == best and w["oscillating"] is True and w["switches"] == 2
    assert (
        "alternates between windows (3 collocated -> 1P2D -> 3 collocated)"
        in alternating["recommendation"]["reason"]
    )


def test_the_twin_error_widens_the_intervals(alternating: dict[str, Any]) -> None:
    doc = alternating
    assert doc["interval"] == "seeds+twin" and doc["twin_run_id"] == "twin-alternating"
    e = doc["twin_error"]["e2e_mean_s"]
    assert e == pytest.approx(0.1)  # the twin's E2E is 1.1 s where the run's was 1.0 s
    for s in doc["splits"]:
        m = s["metrics"]["e2e_mean_s"]
        v = np.array(m["seeds"])
        half = stats.t.ppf(0.975, 1) * v.std(ddof=1) / np.sqrt(2)
        # a twin stored without an interval: its error both ways, real = sim / (1 + error)
        assert m["ci95"] == pytest.approx(
            [(v.mean() - half) / (1 + e), (v.mean() + half) / (1 - e)]
        )


def test_table_output(db: Path) -> None:
    res = runner.invoke(
        app, ["advise", str(db), "--run", "prefill", "--profile", "h200", "--seeds", "1"]
    )
    assert res.exit_code == 0, res.output
    assert "ranked by e2e_mean_s" in res.stdout and "recommendation:" in res.stdout
    assert res.stdout.index("2P1D") < res.stdout.index("1P2D")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--run", "nope"], "unknown run 'nope'"),
        (["--run", "empty", "--profile", "h200"], "no requests with input tokens"),
        (["--run", "unsent", "--profile", "h200"], "did not record when its requests arrived"),
        (["--run", "prefill"], "does not name a simulator profile"),
        (["--run", "prefill", "--profile", "h200", "--nodes", "1"], "at least 2 nodes"),
        (["--run", "prefill", "--profile", "h200", "--seeds", "0"], "--seeds must be >= 1"),
        (["--run", "prefill", "--profile", "h200", "--rank-by", "speed"], "cannot rank by"),
        (["--run", "prefill", "--profile", "h200", "--window", "0"], "--window must be > 0"),
        (["--run", "prefill", "--profile", "h200", "--switch-mode", "x"], "switch mode must"),
        (["--run", "prefill", "--profile", "nosuch"], "unknown profile 'nosuch'"),
    ],
)
def test_bad_input_exits_2_naming_the_problem(db: Path, args: list[str], message: str) -> None:
    res = runner.invoke(app, ["advise", str(db), *args])
    assert res.exit_code == 2, res.output
    assert message in res.output


def test_turns_of_a_branch_share_their_prefix_blocks() -> None:
    # b: 600 tokens, then 600 + 100 output + 300 new; c stands alone; b's third turn
    # shrank (compaction): nothing shared
    got = prefix_hashes(["b", "c", "b", "b"], [600, 256, 1000, 200], [100, 5, 10, 1], 256)
    assert got[0] == [0, 1, 2]  # 600 tokens: two full blocks and a partial one
    assert got[1] == [3]
    assert got[2][:2] == [0, 1] and len(got[2]) == 4 and set(got[2][2:]).isdisjoint(got[0])
    assert set(got[3]).isdisjoint({x for ids in got[:3] for x in ids})


def test_the_runs_split_is_where_its_switches_left_it() -> None:
    cfg = {"split": "1P2D", "nodes": 3}
    assert _split(cfg, 3, None, []) == (1, 2)
    assert _split(cfg, 3, None, [("decode", "prefill")]) == (2, 1)
    assert _split(cfg, 3, None, [("decode", "prefill"), ("prefill", "decode")]) == (1, 2)
    assert _split({"split": "collocated", "nodes": 3}, 3, None, []) is None


def test_a_relaunch_loses_the_nodes_kv_and_can_outlast_the_run(db: Path) -> None:
    result = advise(load_run(db, "alternating"), seeds=1, window_s=10.0, switch_mode="relaunch")
    sw = next(s.switch for s in result.splits if s.split == "2P1D")
    assert sw is not None and sw.mode == "relaunch" and sw.nodes_moved == 1
    assert sw.lost_kv_blocks > 0  # the moved decode node held the decodes' KV
    # the trace is served before the 700 s relaunch (SimConfig.relaunch_s) ends: the switch
    # time is the lower bound up to the run's end
    assert not sw.finished and sw.switch_time_s > 0


def test_should_i_disaggregate_at_all(db: Path) -> None:
    """A run on three collocated engines (no PD split): its own configuration is the
    collocated candidate, ranked against every split with the same seed intervals."""
    result = advise(load_run(db, "prefill"), profile="h200", seeds=2)
    names = [s.split for s in result.splits]
    assert set(names) == {"3 collocated", "2P1D", "1P2D"} and names[-1] == "1P2D"
    assert result.current == "3 collocated"
    col = next(s for s in result.splits if s.split == "3 collocated")
    assert (col.prefill, col.decode, col.switch) == (0, 0, None)
    for m in col.metrics.values():
        v = np.array(m.seeds)
        half = stats.t.ppf(0.975, 1) * v.std(ddof=1) / np.sqrt(2)
        assert m.ci95 == pytest.approx((max(v.mean() - half, 0.0), v.mean() + half))
    # every node prefills: TTFT as low as two prefill nodes give, far below one
    one = next(s for s in result.splits if s.split == "1P2D")
    assert col.metrics["ttft_mean_s"].mean < 1.0 < one.metrics["ttft_mean_s"].mean
    rec = result.recommendation
    assert rec.stay_value == col.metrics["e2e_mean_s"].mean
    if rec.split == "3 collocated":
        assert rec.reason.startswith("stay on 3 collocated")
    else:
        assert "relaunches the engines in their new roles" in rec.reason
    # the table names it and the collocated baseline can be left out
    res = runner.invoke(app, ["advise", str(db), "--run", "prefill", "--profile", "h200",
                              "--seeds", "1", "--no-collocated", "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert [s["split"] for s in json.loads(res.stdout)["splits"]] == ["2P1D", "1P2D"]
    res = runner.invoke(
        app, ["advise", str(db), "--run", "alternating", "--seeds", "1", "--window", "10"]
    )
    assert res.exit_code == 0, res.output
    assert "PD splits and collocated engines of 3 nodes" in res.stdout
    assert "†" in res.stdout and "its cost is not modelled" in res.stdout
