"""pdlab's vLLM stat-logger plugin: scripted vLLM stats -> iteration rows -> `pdlab fit`.

vLLM cannot be installed here (its wheel pulls a CUDA torch), so the stats objects are
`vllm_stats_mirror`'s re-declarations of `vllm/v1/metrics/stats.py` (vLLM main, 2026) and
the plugin is exercised through the interface vLLM calls: `record(scheduler_stats,
iteration_stats, mm_cache_stats=None, engine_idx=0)` once per engine step, the way
`AsyncLLM`'s output handler does. The plugin class is checked against vLLM's rule for entry
points (a subclass of `StatLoggerBase`) with a stub `vllm.v1.metrics.loggers` module.
"""

from __future__ import annotations

import importlib
import json
import sys
import threading
import time
import tomllib
import types
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from typer.testing import CliRunner
from vllm_stats_mirror import (
    CompletedTiming,
    CUDAGraphStat,
    FinishedRequestStats,
    IterationStats,
    PerEngineStatLoggerAdapter,
    PrefixCacheStats,
    SchedulerStats,
    StatLoggerBase,
    check_plugin_class,
    vllm_config,
)

from cluster.wire.iteration_rows import DecodeRow, PrefillRow
from cluster.wire.vllm_step_collector import StepEmitter
from cluster.wire.vllm_steps import decode_step, encode_step, step_from_stats
from models import attn_pairs
from telemetry import TelemetryWriter, open_reader
from toolkit import vllm_plugin
from toolkit.cli import app

ROOT = Path(__file__).resolve().parents[3]
T0 = 1_800_000_000.0  # the run's wall start


class ListSink:
    def __init__(self) -> None:
        self.rows: dict[str, list[dict[str, Any]]] = {}

    def emit(self, table: str, columns: dict[str, list[Any]]) -> None:
        n = len(next(iter(columns.values())))
        self.rows.setdefault(table, []).extend(
            {k: v[i] for k, v in columns.items()} for i in range(n)
        )


def _step(
    t: float,
    *,
    running: int,
    waiting: int = 0,
    kv: float = 0.0,
    new: list[tuple[int, int]] = (),  # type: ignore[assignment]  # (prompt, hits) looked up
    first: list[tuple[int, int, float]] = (),  # type: ignore[assignment]  # (prompt, cached, ttft)
    itls: list[float] = (),  # type: ignore[assignment]
    gen: int | None = None,
    finished: list[FinishedRequestStats] = (),  # type: ignore[assignment]
    scheduled: int | None = None,
) -> tuple[SchedulerStats, IterationStats]:
    """One engine step's stats as vLLM's scheduler and output processor fill them."""
    pcs = PrefixCacheStats()
    for prompt, hits in new:
        pcs.record(num_tokens=prompt, num_hits=hits, preempted=False)
    cg = None if scheduled is None else CUDAGraphStat(scheduled, scheduled, 0, "PIECEWISE")
    s = SchedulerStats(
        num_running_reqs=running,
        num_waiting_reqs=waiting,
        kv_cache_usage=kv,
        prefix_cache_stats=pcs,
        cudagraph_stats=cg,
    )
    it = IterationStats()
    it.iteration_timestamp = T0 + t
    for prompt, cached, ttft in first:
        it.prompt_token_stats.update_from_output(cached, 0, prompt)
        it.time_to_first_tokens_iter.append(ttft)
    it.inter_token_latencies_iter.extend(itls)
    it.num_generation_tokens = len(first) + len(itls) if gen is None else gen
    it.finished_requests.extend(finished)
    return s, it


def _logger(sink: Any, budget: int = 512, blocks: int | None = 1000) -> Any:
    factory = vllm_plugin.pdlab_stat_logger(sink=sink)
    factory.outputs.emitter.mapper.run_start_wall = T0
    return factory(vllm_config(budget, 16, blocks), 0)


def test_scripted_steps_give_the_expected_rows() -> None:
    """A (300 tokens) prefills alone; B (1000, 200 cached) is chunked beside A's decodes."""
    sink = ListSink()
    log = _logger(sink)
    cap = 16 * 1000
    done = FinishedRequestStats(
        "stop", 0.30, 300, 4, None, CompletedTiming(0.0, 0.05, 0.2, 0.25), False, 0
    )
    steps = [
        # 1: A arrives at an idle engine and prefills: no ITL, no busy predecessor -> TTFT.
        _step(0.05, running=1, kv=304 / cap, new=[(300, 0)], first=[(300, 0, 0.05)]),
        # 2: A decodes; B is admitted with 200 cached: 511 of its 800 new tokens fit.
        _step(0.15, running=2, kv=(301 + 200 + 511) / cap, new=[(1000, 200)], itls=[0.10]),
        # 3: A decodes; B's last 289 tokens, its first token.
        _step(0.25, running=2, kv=(302 + 1000) / cap, first=[(1000, 200, 0.2)], itls=[0.10]),
        # 4: both decode.
        _step(0.29, running=2, kv=(303 + 1001) / cap, itls=[0.04, 0.04]),
        # 5: A's last token: it finishes; B decodes on.
        _step(0.33, running=1, kv=1002 / cap, itls=[0.04, 0.04], finished=[done]),
    ]
    for s, it in steps:
        log.record(s, it, mm_cache_stats=None, engine_idx=0)
    pre = sink.rows["prefill_iterations"]
    dec = sink.rows["decode_iterations"]
    expect_pre = [
        PrefillRow(0.0, 0.05, 1, 300, attn_pairs(300, 0), 0, 0),
        # mixed: B's chunk (511 over 200 cached) + A's decode (1 token over 301 - 1)
        PrefillRow(0.05, 0.10, 2, 512, attn_pairs(511, 200) + 301, 0, 200 + 300),
        PrefillRow(0.15, 0.10, 2, 290, attn_pairs(289, 711) + 302, 0, 711 + 301),
    ]
    assert [_prefill(r) for r in pre] == [pytest.approx(tuple(r)[:7], abs=1e-6) for r in expect_pre]
    assert [r["iter_id"] for r in pre] == [0, 1, 2]
    expect_dec = [
        DecodeRow(0.25, 0.04, 2, 1.0, 303 + 1001),
        DecodeRow(0.29, 0.04, 2, 1.0, 1002),
    ]
    assert [_decode(r) for r in dec] == [pytest.approx(tuple(r)[:5], abs=1e-6) for r in expect_dec]
    (req,) = sink.rows["requests"]
    assert (
        req["t_in"] == 300 and req["t_out"] == 4 and req["t_done"] == pytest.approx(0.33, abs=1e-6)
    )
    assert req["t_arrival"] == pytest.approx(0.03, abs=1e-6) and req[
        "t_first_token"
    ] == pytest.approx(0.13, abs=1e-6)
    assert log.outputs.emitter.mapper.by_source == {"ttft": 1, "itl": 4}


def test_cudagraph_metrics_give_the_scheduled_tokens_exactly() -> None:
    """With --cudagraph-metrics the chunk is the step's scheduled tokens less the decodes."""
    sink = ListSink()
    log = _logger(sink, budget=8192)  # a budget the ledger would not cap at
    log.record(*_step(0.05, running=1, new=[(300, 0)], first=[(300, 0, 0.05)]))
    log.record(*_step(0.15, running=2, new=[(1000, 0)], itls=[0.1], scheduled=401))
    (_, mixed) = sink.rows["prefill_iterations"]
    assert mixed["t_uc"] == 401 and mixed["num_reqs"] == 2  # 400 prefill + 1 decode


def _prefill(r: dict[str, Any]) -> tuple[float, ...]:
    return tuple(r[k] for k in PrefillRow._fields[:7])


def _decode(r: dict[str, Any]) -> tuple[float, ...]:
    return tuple(r[k] for k in DecodeRow._fields[:5])


def test_step_message_round_trips_and_rejects_bad_values() -> None:
    s, it = _step(1.0, running=3, waiting=2, kv=0.5, new=[(50, 16)], itls=[0.02, 0.03])
    step = step_from_stats(s, it, 1, budget_tokens=2048, kv_capacity_tokens=4096)
    back = decode_step(encode_step(step))
    assert back == step and back.decoders == 2 and back.itl_min_s == 0.02
    assert back.new_queried == 50 and back.new_hits == 16 and back.engine == 1
    bad = msgspec.structs.replace(step, kv_usage=1.5)
    with pytest.raises(ValueError, match="kv_usage"):
        decode_step(encode_step(bad))
    with pytest.raises(ValueError, match="running"):
        decode_step(msgspec.msgpack.encode({"version": 1, "running": -1}))


def test_older_releases_spellings_are_read() -> None:
    """0.8-era SchedulerStats.gpu_cache_usage and IterationStats.num_prompt_tokens."""
    s = types.SimpleNamespace(num_running_reqs=2, num_waiting_reqs=0, gpu_cache_usage=0.25)
    it = types.SimpleNamespace(
        iteration_timestamp=5.0,
        num_prompt_tokens=120,
        num_generation_tokens=3,
        time_to_first_tokens_iter=[0.2],
        time_per_output_tokens_iter=[0.01, 0.02],
        finished_requests=[],
    )
    step = step_from_stats(s, it, 0)
    assert step.kv_usage == 0.25 and step.prompt_total == 120 and step.prompt_computed is None
    assert step.decoders == 2 and step.itl_min_s == 0.01 and step.first_tokens == 1


def test_plugin_class_is_a_vllm_stat_logger_when_vllm_imports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM refuses entry points that do not subclass its StatLoggerBase (TypeError)."""
    mods = {n: types.ModuleType(n) for n in ("vllm", "vllm.v1", "vllm.v1.metrics")}
    loggers = types.ModuleType("vllm.v1.metrics.loggers")
    loggers.StatLoggerBase = StatLoggerBase  # type: ignore[attr-defined]
    for name, mod in {**mods, "vllm.v1.metrics.loggers": loggers}.items():
        monkeypatch.setitem(sys.modules, name, mod)
    plugin = importlib.reload(vllm_plugin)
    try:
        cls = plugin.PdlabStatLogger
        check_plugin_class("pdlab", cls)
        inst = cls(vllm_config(512, 16, 100), 0)  # no output configured: inert
        assert isinstance(inst, StatLoggerBase) and inst.outputs is None
        inst.record(*_step(1.0, running=1, itls=[0.1]))
        assert inst.num_steps == 0
    finally:
        monkeypatch.undo()
        importlib.reload(vllm_plugin)
    with pytest.raises(TypeError):
        check_plugin_class("pdlab", vllm_plugin._PdlabStatLoggerCore)


def test_entry_point_is_declared_and_resolves() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    value = meta["project"]["entry-points"]["vllm.stat_logger_plugins"]["pdlab"]
    module, attr = value.split(":")
    cls = getattr(importlib.import_module(module), attr)
    assert isinstance(cls, type) and hasattr(cls, "record")


def _truth_prefill(u: int, c: int) -> float:
    """Eq. 1 without host restores (vLLM reports none): c0 + c1*t_uc + c2*A."""
    return 0.004 + 2.0e-5 * u + 3.0e-9 * attn_pairs(u, c)


def _truth_decode(b: int) -> float:
    return 0.012 + 2.5e-4 * b


def test_pdlab_fit_recovers_the_iteration_models_from_plugin_rows(tmp_path: Path) -> None:
    """Scripted vLLM steps timed by a known Eq. 1 / Eq. 2, through the plugin's DuckDB
    output, then `pdlab fit`: the coefficients come back within a few percent."""
    rng = np.random.default_rng(3)
    db = tmp_path / "vllm.duckdb"
    writer = TelemetryWriter(db, run_id="vllm-plugin", source="vllm")
    writer.add_nodes(
        {
            "node_id": [0],
            "name": ["engine-0"],
            "hardware": ["H200 Llama-3.1-8B"],
            "moe_top_k": [0],
            "moe_experts": [0],
        }
    )
    factory = vllm_plugin.pdlab_stat_logger(sink=writer)
    factory.outputs.emitter = StepEmitter(T0, writer)
    log = factory(vllm_config(8192, 16, 20000), 0)
    t = 0.0
    # Prefill-only requests (max_tokens=1) back to back: a queue keeps the engine busy, so
    # each step's duration is the interval since the previous one.
    log.record(*_step(t, running=0, waiting=5))
    for _ in range(400):
        u, c = int(rng.integers(64, 4096)), int(rng.choice([0, 0, 512, 2048]))
        t += _truth_prefill(u, c) * rng.normal(1.0, 0.02)
        log.record(*_step(t, running=0, waiting=5, new=[(u + c, c)], first=[(u + c, c, 1.0)]))
    # Decode batches of varying size: the ITL of every request is the step time.
    for _ in range(400):
        b = int(rng.integers(1, 128))
        dt = _truth_decode(b) * rng.normal(1.0, 0.02)
        t += dt
        log.record(*_step(t, running=b, kv=0.2, itls=[dt] * b))
    writer.close()
    r = open_reader(db)
    n_pre = r.sql("SELECT count(*) AS n FROM prefill_iterations")["n"][0]
    n_dec = r.sql("SELECT count(*) AS n FROM decode_iterations")["n"][0]
    assert (n_pre, n_dec) == (400, 400)
    res = CliRunner().invoke(app, ["fit", str(db), "--json"])
    assert res.exit_code == 0, res.output
    (node,) = json.loads(res.stdout)["nodes"]
    pre, dec = node["prefill"]["coef"], node["decode"]["coef"]
    assert pre[0] == pytest.approx(0.004, rel=0.10)
    assert pre[1] == pytest.approx(2.0e-5, rel=0.05)
    assert pre[2] == pytest.approx(3.0e-9, rel=0.10)
    assert dec[0] == pytest.approx(0.012, rel=0.05) and dec[2] == pytest.approx(2.5e-4, rel=0.05)
    assert node["prefill"]["mape"] < 0.03 and node["decode"]["mape"] < 0.03


def test_collect_vllm_steps_over_zmq(tmp_path: Path) -> None:
    """The plugin publishing (PDLAB_VLLM_STEPS mode), `pdlab collect vllm-steps` writing."""
    factory = vllm_plugin.pdlab_stat_logger(steps="tcp://127.0.0.1:0", replay="tcp://127.0.0.1:0")
    out = factory.outputs
    log = factory(vllm_config(512, 16, 1000), 0)
    db = tmp_path / "steps.duckdb"

    def engine() -> None:
        time.sleep(1.0)
        t = time.time()
        log.record(*_step(t - T0, running=1, new=[(300, 0)], first=[(300, 0, 0.05)]))
        for i in range(1, 30):
            if i == 10:
                out.publisher.drop_live(3)  # lost live, recovered through the replay socket
            log.record(*_step(t - T0 + 0.02 * i, running=1, kv=0.02, itls=[0.02]))

    th = threading.Thread(target=engine)
    th.start()
    try:
        res = CliRunner().invoke(
            app,
            [
                "collect",
                "vllm-steps",
                "--connect",
                out.publisher.endpoint,
                "--replay",
                str(out.publisher.replay_endpoint),
                "--db",
                str(db),
                "--seconds",
                "2.5",
                "--run-id",
                "steps",
                "--catch-up",
                "--json",
            ],
        )
    finally:
        th.join()
        out.close()
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 30 and summary["messages_lost"] == 0
    assert summary["prefill_iterations"] == 1 and summary["decode_iterations"] == 29
    r = open_reader(db)
    dec = r.table("decode_iterations", run_id="steps")
    assert dec.height == 29 and dec["duration_s"].to_list() == pytest.approx([0.02] * 29)
    assert r.runs()["source"].to_list() == ["vllm"]


def test_vllm_meanings_name_real_columns() -> None:
    from telemetry.engine_meanings import VLLM_COLUMNS, VLLM_NOT_REPORTED
    from telemetry.schema import TABLES

    for table, cols in VLLM_COLUMNS.items():
        names = {c.name for c in TABLES[table]}
        assert set(cols) <= names, (table, set(cols) - names)
    assert set(VLLM_NOT_REPORTED) <= set(TABLES)


def test_a_dp_server_gives_each_rank_its_own_rows_through_vllms_adapter() -> None:
    """AsyncLLM(stat_loggers=[factory]) with DP 2: StatLoggerManager wraps the factory in a
    PerEngineStatLoggerAdapter; each rank's steps keep their own ledger and node."""
    sink = ListSink()
    factory = vllm_plugin.pdlab_stat_logger(sink=sink)
    factory.outputs.emitter.mapper.run_start_wall = T0
    manager = PerEngineStatLoggerAdapter(vllm_config(512, 16, 1000), [0, 1], factory)
    manager.log_engine_initialized()
    manager.record(*_step(0.05, running=1, new=[(300, 0)], first=[(300, 0, 0.05)]), engine_idx=0)
    manager.record(*_step(0.06, running=1, new=[(1000, 0)]), engine_idx=1)  # chunk 1 of 2
    manager.record(*_step(0.15, running=1, itls=[0.1]), engine_idx=0)
    manager.record(*_step(0.16, running=1, first=[(1000, 0, 0.16)]), engine_idx=1)
    manager.log()
    pre = sink.rows["prefill_iterations"]
    assert [(r["node_id"], r["t_uc"]) for r in pre] == [(0, 300), (1, 488)]
    (dec,) = sink.rows["decode_iterations"]
    assert dec["node_id"] == 0 and dec["batch_size"] == 1
    assert factory.outputs.emitter.mapper.untimed == 1  # rank 1's first chunk: no duration
