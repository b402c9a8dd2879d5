"""Serving overheads and pass work fitted from a run's telemetry (toolkit.fit.overheads,
`pdlab fit --target`).

A synthetic live PD run is written through the telemetry writer with known injected delays
per stage and known pass work: the fitted stages recover the delays (the prefill wake-up
and the decode join only from requests that found their engine idle), are stored in
`overhead_fits` and read back; the forms fitted on the engine thread's CPU time recover the
pass model where the wall time is that work spread by a host's contention.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from telemetry import TelemetryWriter
from toolkit.cli import app
from toolkit.fit.overheads import fit_overheads, load_overheads, save_overheads
from toolkit.queries.run import open_run

runner = CliRunner()
# injected stage delays (seconds): lognormal medians with sigma 0.4
TRUTH = {"ingress": 0.012, "handoff": 0.02, "join": 0.003, "first_out": 0.005, "last_out": 0.008}
WAKE = 0.001  # the idle prefill engine's wake-up
SIGMA = 0.4


def _write_run(db, n: int = 400, seed: int = 0) -> str:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)

    def d(median: float, size: int = n) -> np.ndarray:
        return rng.lognormal(np.log(median), SIGMA, size)

    w = TelemetryWriter(db, run_id="live", source="torch", config={})
    w.add_nodes({"node_id": [0, 1], "name": ["p", "d"], "hardware": ["cpu"] * 2,
                 "moe_top_k": [2, 2], "moe_experts": [16, 16]})  # fmt: skip
    # requests 1 s apart: every engine idle when a request reaches it, except every 10th,
    # queued while the previous one's prefill pass runs (busy: queueing, not a wake-up)
    arrival = np.arange(n) * 1.0
    queued = arrival + d(TRUTH["ingress"])
    forward = queued + d(WAKE)
    busy = np.arange(n) % 10 == 9
    prefill_s = np.full(n, 0.03)
    queued[busy] = forward[np.flatnonzero(busy) - 1] + 0.01
    arrival[busy] = queued[busy] - d(TRUTH["ingress"], int(busy.sum()))
    forward[busy] = forward[np.flatnonzero(busy) - 1] + prefill_s[0] + 0.002
    done = forward + prefill_s
    kv = done + d(TRUTH["handoff"])
    join = kv + d(TRUTH["join"])
    first_tok = join + d(TRUTH["first_out"])
    last_emit = join + 0.05
    t_done = last_emit + d(TRUTH["last_out"])
    # the previous request of a busy one overlaps it on the prefill engine
    prev_done = np.roll(done, 1)
    prev_done[0] = -1.0
    assert (prev_done[busy] > queued[busy]).all()
    ids = [f"r{i}" for i in range(n)]
    w.emit("requests", {
        "request_id": ids, "program_id": ids, "branch_id": ids, "t_arrival": arrival,
        "prefill_node": [0] * n, "decode_node": [1] * n, "t_in": [100] * n, "t_c": [0] * n,
        "t_fetch": [0] * n, "t_out": [6] * n, "t_prefill_start": arrival,
        "t_first_token": first_tok, "t_done": t_done,
    })  # fmt: skip
    w.emit("request_stages", {
        "request_id": ids, "t_dispatched": arrival, "t_prefill_received": queued,
        "t_prefill_queued": queued, "t_prefill_forward": forward, "t_prefill_done": done,
        "t_kv_ready": kv, "t_decode_join": join, "t_first_emit": join, "t_last_emit": last_emit,
        "t_prefill_answer": done,
    })  # fmt: skip
    # passes: CPU work from known forms; wall = work x a host's contention (lognormal)
    m = 600
    b = rng.integers(1, 5, m)
    ctx = rng.integers(100, 3000, m)
    phi = 1 - (1 - 2 / 16) ** b
    cpu = 1e-3 + 2e-3 * phi + 5e-4 * b + 1e-6 * ctx
    wall = cpu * rng.lognormal(np.log(2.5), 0.5, m)
    w.emit("decode_iterations", {
        "node_id": [1] * m, "iter_id": np.arange(m), "t_start": np.arange(m) * 0.5,
        "duration_s": wall, "batch_size": b, "t_fwd": [1.0] * m, "ctx_tokens": ctx,
        "overhead_s": 0.002 + 0.001 * (b - 1) + rng.exponential(0.0005, m), "cpu_s": cpu,
    })  # fmt: skip
    uc = rng.integers(16, 800, m)
    cpu_p = 2e-3 + 3e-5 * uc + 1e-8 * uc * (uc + 1) / 2
    w.emit("prefill_iterations", {
        "node_id": [0] * m, "iter_id": np.arange(m), "t_start": np.arange(m) * 0.5,
        "duration_s": cpu_p * rng.lognormal(np.log(2.5), 0.5, m), "num_reqs": [1] * m,
        "t_uc": uc, "attn_pairs": uc * (uc + 1) / 2, "t_rst": [0] * m, "t_c": [0] * m,
        "overhead_s": [0.004] * m, "cpu_s": cpu_p,
    })  # fmt: skip
    w.close()
    return "live"


@pytest.fixture(scope="module")
def live_db(tmp_path_factory):  # type: ignore[no-untyped-def]
    db = tmp_path_factory.mktemp("overheads") / "live.duckdb"
    _write_run(db)
    return db


def test_injected_stage_delays_are_recovered(live_db) -> None:  # type: ignore[no-untyped-def]
    run_id, ov = fit_overheads(live_db, None)
    assert run_id == "live"
    mean = np.exp(SIGMA**2 / 2)  # a lognormal's mean over its median
    for stage, median in TRUTH.items():
        f = ov.get(stage)
        assert f is not None, stage
        # the join only from requests whose decode engine was idle: the busy ones' KV
        # arrives while their predecessor decodes
        assert f.samples == 400 or (stage == "join" and 360 <= f.samples < 400), stage
        assert f.quantiles_s[10] == pytest.approx(median, rel=0.1), stage
        assert f.mean_s == pytest.approx(median * mean, rel=0.1), stage
        assert f.log_sigma == pytest.approx(SIGMA, rel=0.15), stage
    # the wake-up only from the 360 requests that found the prefill engine idle
    wait = ov.get("prefill_wait")
    assert wait is not None and wait.samples == 360
    assert wait.mean_s == pytest.approx(WAKE * mean, rel=0.1)
    # each pass's CPU overhead: 2 ms, 1 ms per further sequence
    dec = ov.get("decode_pass")
    assert dec is not None and dec.per_seq_s == pytest.approx(0.001, rel=0.1)
    assert dec.mean_s == pytest.approx(0.0025, rel=0.1)
    assert ov.ttft_s == pytest.approx(
        sum(ov.mean_s(s) for s in ("ingress", "prefill_wait", "handoff", "join", "first_out"))
    )


def test_overheads_are_stored_with_the_run_and_read_back(live_db) -> None:  # type: ignore[no-untyped-def]
    _, ov = fit_overheads(live_db, "live")
    assert save_overheads(live_db, "live", ov) == len(ov.stages)
    assert save_overheads(live_db, "live", ov) == len(ov.stages)  # replaced, not added
    with open_run(live_db, "live") as run:
        back = load_overheads(run)
        assert run.count("overhead_fits") == len(ov.stages)
    assert back is not None and back.stages == ov.stages


def test_forms_fitted_on_the_passes_cpu_time_recover_the_work_under_contention(
    live_db,
) -> None:  # type: ignore[no-untyped-def]
    res = runner.invoke(app, ["fit", str(live_db), "--form", "auto", "--json", "--no-write"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    dec = next(n["decode"] for n in doc["nodes"] if n["node_id"] == 1)
    pre = next(n["prefill"] for n in doc["nodes"] if n["node_id"] == 0)
    assert dec["target"] == pre["target"] == "cpu_s"
    assert dec["form"] == "ctx" and dec["mape"] < 0.02  # the work is exact here
    assert dec["coef"] == pytest.approx([1e-3, 2e-3, 5e-4, 1e-6], rel=0.05)
    assert pre["mape"] < 0.02
    assert dec["wall_per_cpu"] == pytest.approx(2.5 * np.exp(0.5**2 / 2), rel=0.1)
    assert set(doc["overheads"]) >= set(TRUTH)
    # the same forms on the wall time carry the contention's spread
    res = runner.invoke(
        app, ["fit", str(live_db), "--form", "auto", "--json", "--no-write", "--target", "wall"]
    )
    assert res.exit_code == 0, res.output
    wall = next(n["decode"] for n in json.loads(res.stdout)["nodes"] if n["node_id"] == 1)
    assert "target" not in wall and wall["mape"] > 0.25
    bad = runner.invoke(app, ["fit", str(live_db), "--target", "gpu"])
    assert bad.exit_code == 2 and "--target must be auto, wall or cpu" in bad.output
