"""`pdlab twin`: replay a recorded run on engine models and say how close it came (SPEC §9).

`run_twin` loads what the replay needs (toolkit.twin.engine_inputs: engine settings, KV
capacity, the profile's iteration pricer with the recorded interconnect, the requests),
replays the requests with their recorded arrivals, input and output lengths and DP ranks
on one engine model per rank (cluster.sim.engine_model), and compares, per metric (mean,
P50, P90, P99 of TTFT, TPOT and E2E; throughput), the real run with the replay: relative
error sim / real - 1, and a 95% bootstrap interval of that error (requests resampled with
replacement, real and simulated together, so the interval covers which requests the run
happened to have). Metrics are defined as toolkit.queries.serving defines them. Requests
without a recorded DP rank go where vLLM's DP load balancer would send them, and the DP
ranks of an MoE model with expert parallelism step together (cluster.sim.engine_model.
replay); every parameter the replay rests on is listed with its source and range
(`inputs.parameters`, toolkit.twin.parameters) and stored with the twin run. The
simulated requests are stored as a run of source 'twin' (`store_twin_run`) so the figures
and queries that read runs can compare the two.

With `interval` (the default) each metric's `ci95` combines that bootstrap with the model's
own error (toolkit.twin.interval: the profile's held-out residuals, the ranged parameters
at their low and high ends), a few more replays; `ci95_requests` keeps the bootstrap's. A profile of another model or GPU is refused unless `force`
(toolkit.twin.guards); a forced twin says so in its result and its stored config.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from cluster.core import ConfigError
from cluster.sim.engine_model import EngineReplay, IterationOverhead, ReplayRequest, replay
from toolkit.queries.run import open_run
from toolkit.twin.engine_inputs import EngineInputs, load_engine_inputs
from toolkit.twin.interval import (
    PROFILE_REPLAYS,
    IntervalSource,
    engine_runner,
    interval_sources,
    sim_interval,
    sim_timings,
    with_intervals,
)
from toolkit.twin.metrics import (
    BOOTSTRAP_SAMPLES,
    Timings,
    TwinMetric,
    compare,
    request_spread,
    run_values,
    twin_run_id,
)
from toolkit.twin.parameters import ReplayParameter, setup_of

SPAN_KEYS = ("span_s", "throughput_tok_s")
__all__ = ["TwinResult", "replay_inputs", "run_twin", "sim_timings", "store_twin_run"]


class TwinResult(NamedTuple):
    run_id: str
    twin_run_id: str | None
    inputs: EngineInputs
    engines: list[EngineReplay]
    metrics: dict[str, TwinMetric]
    replay_wall_s: float
    requests: list[ReplayRequest]  # as replayed, in the order of `real` and `sim`
    real: Timings
    sim: Timings
    sources: list[IntervalSource] | None = None
    interval_wall_s: float = 0.0  # the interval's extra replays

    @property
    def parameters(self) -> list[ReplayParameter]:
        """What the replay rests on, with sources and ranges (toolkit.twin.parameters)."""
        return list(self.inputs.parameters)

    @property
    def forced(self) -> bool:
        return bool(self.inputs.guards and self.inputs.guards.forced)

    def to_json(self) -> dict[str, Any]:
        e = self.inputs.engine
        g = self.inputs.guards
        return {
            "run_id": self.run_id,
            "twin_run_id": self.twin_run_id,
            "metrics": {k: metric_json(m) for k, m in self.metrics.items()},
            "forced": self.forced,
            "guards": None if g is None else g.to_json(),
            "extrapolating": [] if g is None else g.extrapolating,
            "parameters": [p.to_json() for p in self.parameters],
            "interval": {
                "sources": [s.to_json() for s in self.sources or []],
                "combine": "quadrature of log(sim/real) spreads per side",
                "replays": sum(s.replays for s in self.sources or []),
                "wall_s": self.interval_wall_s,
            },
            "requests": self.inputs.requests.height,
            "replay_wall_s": self.replay_wall_s,
            "iterations": sum(x.num_iterations for x in self.engines),
            "preemptions": sum(x.num_preemptions for x in self.engines),
            "engine": {
                "max_num_seqs": e.max_num_seqs,
                "max_num_batched_tokens": e.max_num_batched_tokens,
                "tensor_parallel_size": e.tensor_parallel_size,
                "data_parallel_size": e.data_parallel_size,
                "expert_parallel_size": e.expert_parallel_size,
                "kv_blocks": self.inputs.kv.blocks,
                "kv_source": self.inputs.kv.source,
                "link_gbps": self.inputs.pricer.parallel.link_gbps,
                "link_latency_s": self.inputs.pricer.parallel.link_latency_s,
                "link_source": self.inputs.link,
                "ranks": self.inputs.ranks,
            },
            "profile_calibration": calibration_summary(self.inputs.calibration),
            "dp_ranks": [
                {
                    "rank": x.engine,
                    "requests": len(x.requests),
                    "iterations": x.num_iterations,
                    "dummy_iterations": x.dummy_iterations,
                    "running_mean": x.running_mean,
                    "running_max": max((t[1] for t in x.trace), default=0),
                    "preemptions": x.num_preemptions,
                }
                for x in self.engines
            ],
        }


def metric_json(m: TwinMetric) -> dict[str, Any]:
    """One metric's JSON: real, sim, error, ci95 (of the error) and, once combined, the
    bootstrap's interval, whether the interval covers the real value, its half-width and
    the twin's prediction interval of the metric itself."""
    doc: dict[str, Any] = {"real": m.real, "sim": m.sim, "error": m.error, "ci95": list(m.ci95)}
    if m.sources is not None:
        doc |= {
            "ci95_requests": None if m.ci95_requests is None else list(m.ci95_requests),
            "covered": m.covered if m.known else None,
            "half_width": m.half_width,
            "interval": list(sim_interval(m)),
            "sources": {k: list(v) for k, v in m.sources.items()},
        }
    return doc


def calibration_summary(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    """What an in-situ calibrated profile was fitted on (toolkit.profiles.torch_calibration)."""
    if not doc:
        return None
    keys = ("fitted_on", "fixed_factor", "unit_factor", "link_gbps", "link_latency_s")
    out = {k: doc.get(k) for k in keys}
    out["fitted_on"] = out["fitted_on"] or doc.get("run")
    return out


def run_twin(
    db: str | Path,
    run_id: str | None,
    profile: str | Path,
    *,
    overhead: IterationOverhead | None = None,
    store: bool = True,
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = 0,
    interval: bool = True,
    profile_replays: int = PROFILE_REPLAYS,
    force: bool = False,
    **flags: Any,
) -> TwinResult:
    """Replay one imported run and compare (module docstring); `flags` go to
    toolkit.twin.engine_inputs.load_engine_inputs (GPU memory, batch limits, link)."""
    inputs = load_engine_inputs(db, run_id, profile, force=force, **flags)
    if overhead is not None:  # the replay's CPU overhead; the parameters say it
        inputs = _with_overhead(inputs, overhead)
    if inputs.requests.height == 0:
        raise ConfigError(
            f"run {inputs.run_id!r} has no finished requests to replay: it holds no per-request "
            "records (a vLLM result saved without --save-detailed keeps only its summary)"
        )
    if inputs.arrivals == "unknown":
        raise ConfigError(
            f"run {inputs.run_id!r} did not record when its requests arrived (a benchmark "
            "without send times): a replay needs the arrivals"
        )
    with open_run(db, inputs.run_id) as run:
        bench = run.config().get("benchmark")
    cap = bench.get("max_concurrency") if isinstance(bench, dict) else None
    if inputs.arrivals == "burst" and cap:
        raise ConfigError(
            f"run {inputs.run_id!r} was sent by a client keeping at most {cap} requests in "
            "flight (each send waited for a completion): the twin replays recorded arrivals only"
        )
    df = inputs.requests.filter(
        inputs.requests["t_first_token"].is_not_null() & inputs.requests["t_done"].is_not_null()
    )
    if df.height == 0:
        raise ConfigError(
            f"run {inputs.run_id!r} has no finished requests to replay (import a run with "
            "per-request first-token and done times)"
        )
    reqs = [
        ReplayRequest(
            str(r["request_id"]), float(r["t_arrival"]), int(r["t_in"]), int(r["t_out"]), r["node"]
        )
        for r in df.iter_rows(named=True)
    ]
    if inputs.engine.data_parallel_size == 1:
        reqs = [q._replace(engine=0) for q in reqs]
    t0 = time.perf_counter()
    engines = replay_inputs(inputs, reqs)
    wall = time.perf_counter() - t0
    arr = np.array([q.arrival_s for q in reqs])
    t_out = np.array([q.output_tokens for q in reqs], dtype=float)
    real = Timings(
        arr,
        t_out,
        df["t_first_token"].to_numpy().astype(float),
        df["t_done"].to_numpy().astype(float),
    )
    sim_t = sim_timings(reqs, engines)
    metrics = compare(real, sim_t, samples=samples, seed=seed)
    sources: list[IntervalSource] | None = None
    t1 = time.perf_counter()
    if interval:
        # the metrics, and span and token rate for `pdlab validate` (toolkit.validate.bench)
        base = {k: v for k, v in run_values(sim_t).items() if k in metrics or k in SPAN_KEYS}
        sources = interval_sources(
            base, inputs.parameters, engine_runner(reqs, setup_of(inputs), run_values),
            requests={k: request_spread(metrics[k]) for k in base if k in metrics},
            peak_blocks=[max((b for e in engines for *_, b in e.trace), default=0)],
            profile_replays=profile_replays, seed=seed,
        )  # fmt: skip
        if inputs.guards is not None and inputs.guards.forced:
            # A profile of another model or GPU: no measured error bounds what it misses.
            sources.append(
                IntervalSource(
                    "forced", "forced", "--force: the profile describes another model or GPU",
                    0, dict.fromkeys(metrics, (math.inf, math.inf)),
                )
            )  # fmt: skip
        metrics = with_intervals(metrics, sources)
    result = TwinResult(
        inputs.run_id, None, inputs, engines, metrics, wall, reqs, real, sim_t, sources,
        time.perf_counter() - t1,
    )  # fmt: skip
    if store:
        result = result._replace(twin_run_id=store_twin_run(db, result, str(profile)))
    return result


def replay_inputs(
    inputs: EngineInputs, reqs: list[ReplayRequest], overhead: IterationOverhead | None = None
) -> list[EngineReplay]:
    """Replay `reqs` on the engines `inputs` describe (e.g. toolkit.twin.parameters.
    with_parameters' inputs); `overhead` replaces the inputs' CPU overhead."""
    over = inputs.overhead if overhead is None else overhead
    return replay(reqs, inputs.engine, inputs.kv.blocks, inputs.pricer, over)


def _with_overhead(inputs: EngineInputs, overhead: IterationOverhead) -> EngineInputs:
    """`inputs` replayed with `overhead`; `cpu_overhead`'s note says it is the base."""
    base = (
        f"; on top of the replay's {1e3 * overhead.per_iteration_s:.3g} ms + "
        f"{1e6 * overhead.per_sequence_s:.3g} us/seq"
    )
    params = tuple(
        replace(p, note=p.note + base) if p.name == "cpu_overhead" else p for p in inputs.parameters
    )
    return inputs._replace(overhead=overhead, parameters=params)


def store_twin_run(db: str | Path, result: TwinResult, profile: str) -> str:
    """Write the replayed requests as run `twin-<run>[-n]` (source 'twin'); returns its id.

    Its config holds what the twin was made with and how far to trust it: the profile, the
    guard checks and `forced` (made with --force against a profile of another model or
    GPU), the parameters with their sources, and per metric the error and its intervals.
    """
    from toolkit.importers import BenchRun, write_runs

    inputs, engines = result.inputs, result.engines
    rid = twin_run_id(db, inputs.run_id)
    e = inputs.engine
    run = BenchRun(
        run_id=rid,
        started_at=datetime.now(UTC),
        source="twin",
        config={
            "twin_of": inputs.run_id,
            "profile": profile,
            "engine": e.to_json(),
            "kv_blocks": inputs.kv.blocks,
            "kv_source": inputs.kv.source,
            "link": {
                "link_gbps": inputs.pricer.parallel.link_gbps,
                "link_latency_s": inputs.pricer.parallel.link_latency_s,
                "source": inputs.link,
            },
            "ranks": inputs.ranks,
            "arrivals": "replayed",
            "forced": result.forced,
            "guards": None if inputs.guards is None else inputs.guards.to_json(),
            "parameters": [p.to_json() for p in result.parameters],
            "metrics": {k: metric_json(m) for k, m in result.metrics.items()},
        },
        node_names=[f"twin-dp{i}" for i in range(e.data_parallel_size)],
        hardware=e.hardware or "unknown",
        moe_top_k=inputs.shape.top_k if inputs.shape.is_moe else 0,
        moe_experts=inputs.shape.num_experts if inputs.shape.is_moe else 0,
    )
    for eng in engines:
        for r in sorted(eng.requests, key=lambda r: (r.arrival_s, r.request_id)):
            run.add_request(
                request_id=r.request_id,
                program_id=r.request_id,
                branch_id=r.request_id,
                t_arrival=r.arrival_s,
                prefill_node=eng.engine,
                decode_node=eng.engine,
                t_in=r.prompt_tokens,
                t_c=0,
                t_fetch=0,
                t_out=r.output_tokens,
                t_first_token=r.first_token_s,
                t_done=r.done_s,
            )
    write_runs(db, [run])
    return rid
