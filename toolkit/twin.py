"""`pdlab twin`: replay a recorded run on engine models and say how close it came (SPEC §9).

`run_twin` loads what the replay needs (toolkit.engine_inputs: engine settings, KV
capacity, the profile's iteration pricer with the recorded interconnect, the requests),
replays the requests with their recorded arrivals, input and output lengths and DP ranks
on one engine model per rank (cluster.sim.engine_model), and compares, per metric (mean,
P50, P90, P99 of TTFT, TPOT and E2E; throughput), the real run with the replay: relative
error sim / real - 1, and a 95% bootstrap interval of that error (requests resampled with
replacement, real and simulated together, so the interval covers which requests the run
happened to have). Metrics are defined as toolkit.queries.serving defines them. Requests
without a recorded DP rank go where vLLM's DP load balancer would send them, and the DP
ranks of an MoE model with expert parallelism step together (cluster.sim.engine_model.
replay); what no data measured is listed with its source (`parameters`,
toolkit.twin_parameters) and stored with the twin run. The
simulated requests are stored as a run of source 'twin' (`store_twin_run`) so the figures
and queries that read runs can compare the two.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from cluster.core import ConfigError
from cluster.sim.engine_model import EngineReplay, IterationOverhead, ReplayRequest, replay
from toolkit.engine_inputs import EngineInputs, load_engine_inputs
from toolkit.queries.run import open_run
from toolkit.twin_metrics import BOOTSTRAP_SAMPLES, Timings, TwinMetric, compare, twin_run_id


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

    def to_json(self) -> dict[str, Any]:
        e = self.inputs.engine
        return {
            "run_id": self.run_id,
            "twin_run_id": self.twin_run_id,
            "metrics": {
                k: {"real": m.real, "sim": m.sim, "error": m.error, "ci95": list(m.ci95)}
                for k, m in self.metrics.items()
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
            "parameters": [p.to_json() for p in self.inputs.parameters],
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


def calibration_summary(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    """What an in-situ calibrated profile was fitted on (toolkit.torch_profile_calibration)."""
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
    **flags: Any,
) -> TwinResult:
    """Replay one imported run and compare (module docstring); `flags` go to
    toolkit.engine_inputs.load_engine_inputs (GPU memory, batch limits, link)."""
    inputs = load_engine_inputs(db, run_id, profile, **flags)
    if overhead is not None:  # the replay's CPU overhead, said in its parameters too
        from toolkit.twin_parameters import with_parameters

        cpu = {"cpu_overhead_per_iteration_s": overhead.per_iteration_s}
        inputs = with_parameters(inputs, cpu)._replace(overhead=overhead)
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
    twin_id = store_twin_run(db, inputs, engines, str(profile)) if store else None
    return TwinResult(inputs.run_id, twin_id, inputs, engines, metrics, wall, reqs, real, sim_t)


def replay_inputs(
    inputs: EngineInputs, reqs: list[ReplayRequest], overhead: IterationOverhead | None = None
) -> list[EngineReplay]:
    """Replay `reqs` on the engines `inputs` describe (e.g. toolkit.twin_parameters.
    with_parameters' inputs); `overhead` replaces the inputs' CPU overhead."""
    over = inputs.overhead if overhead is None else overhead
    return replay(reqs, inputs.engine, inputs.kv.blocks, inputs.pricer, over)


def sim_timings(reqs: list[ReplayRequest], engines: list[EngineReplay]) -> Timings:
    """The replayed times of `reqs`, in their order."""
    by_id = {r.request_id: r for e in engines for r in e.requests}
    sim = [by_id[q.request_id] for q in reqs]
    return Timings(
        np.array([q.arrival_s for q in reqs]),
        np.array([q.output_tokens for q in reqs], dtype=float),
        np.array([r.first_token_s for r in sim], dtype=float),
        np.array([r.done_s for r in sim], dtype=float),
    )


def store_twin_run(
    db: str | Path, inputs: EngineInputs, engines: list[EngineReplay], profile: str
) -> str:
    """Write the replayed requests as run `twin-<run>[-n]` (source 'twin'); returns its id."""
    from toolkit.importers import BenchRun, write_runs

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
            "parameters": [p.to_json() for p in inputs.parameters],
            "arrivals": "replayed",
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
