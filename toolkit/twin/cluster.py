"""`pdlab twin DB --run R` of a PD cluster run: the cluster simulator priced by the run's own fits.

The twin of a live torch (or SGLang, or simulated) cluster run needs no operator profile:
`toolkit.twin.cluster_inputs` reads the run's cluster settings, fits Eq. 1 / Eq. 2 per node from
its iteration logs into a simulator profile (each phase scaled to the run's measured pass
time unless `rescale` is False), and writes its finished requests as an open-loop trace
(recorded arrivals, input and output lengths, cached prefixes). The cluster simulator
(cluster.sim) serves that trace on the same nodes, split (kept static: the planner is
'static'), router, decode binder and KV fetch, with the run's serving overheads where it
measured them (a live run's request stages and pass overheads, models.overheads), and `toolkit.twin.metrics.compare` gives
per metric (TTFT, TPOT, E2E: mean, P50, P90, P99; throughput) the real and simulated value,
the relative error sim / real - 1 and its paired bootstrap 95% interval. The simulated
requests are stored as a run of source 'twin' (`twin-<run>[-n]`) with the real request ids
and the real time axis, so the queries that compare runs read both.
"""

from __future__ import annotations

import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from cluster.core import ConfigError
from cluster.sim.config import SimConfig
from cluster.sim.entities import SimRequest
from cluster.sim.simulator import Simulator
from cluster.size_limits import SIM_SECONDS
from models.overheads import ServingOverheads
from toolkit.fit.overheads import overheads_json
from toolkit.twin.cluster_inputs import ClusterInputs, load_cluster_inputs, write_trace
from toolkit.twin.metrics import BOOTSTRAP_SAMPLES, Timings, TwinMetric, compare, twin_run_id


class ClusterTwinResult(NamedTuple):
    run_id: str
    twin_run_id: str | None
    inputs: ClusterInputs
    metrics: dict[str, TwinMetric]
    replay_wall_s: float
    lead_s: float  # the shift of the simulated time axis (a priming request ran first)
    sim_requests: list[SimRequest]  # in the order of `real` and `sim`
    iterations: int
    real: Timings
    sim: Timings

    def to_json(self) -> dict[str, Any]:
        """The vLLM twin's object (run ids, metrics, requests, wall time, iterations,
        preemptions), with "cluster" (settings, fits, profile) in place of "engine"."""
        fits = self.inputs.fits
        prof = self.inputs.profile
        real_c = int(self.inputs.requests["t_c"].sum())
        return {
            "run_id": self.run_id,
            "twin_run_id": self.twin_run_id,
            "metrics": {
                k: {"real": m.real, "sim": m.sim, "error": m.error, "ci95": list(m.ci95)}
                for k, m in self.metrics.items()
            },
            "requests": len(self.sim_requests),
            "replay_wall_s": self.replay_wall_s,
            "iterations": self.iterations,
            "preemptions": sum(r.preemptions for r in self.sim_requests),
            "cluster": {
                **self.inputs.cluster.to_json(),
                "lead_s": self.lead_s,
                "cached_tokens": {"real": real_c, "sim": sum(r.t_c for r in self.sim_requests)},
                "scale": {"prefill": self.inputs.scale[0], "decode": self.inputs.scale[1]},
                "profile": {
                    "prefill": list(prof.prefill),
                    "decode": list(prof.decode),
                    "moe_top_k": prof.top_k,
                    "moe_experts": prof.num_experts,
                },
                "fits": [
                    {
                        "node_id": n.node_id,
                        "phase": f.phase,
                        "form": f.form,
                        "target": f.target,
                        "coef": None if f.coef is None else list(f.coef),
                        "mape": f.mape,
                        "samples": f.samples,
                    }
                    for n in fits.nodes
                    for f in (n.prefill, n.decode)
                ],
                "overheads": overheads_json(self.inputs.overheads or ServingOverheads()),
            },
        }


def run_cluster_twin(
    db: str | Path,
    run_id: str | None,
    *,
    store: bool = True,
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = 0,
    rescale: bool = True,
    overheads: bool = True,
) -> ClusterTwinResult:
    """Simulate one cluster run's requests and compare (module docstring); `rescale` False
    prices passes by the fits as they are (toolkit.twin.cluster_inputs.mean_scale), `overheads`
    False leaves the run's serving overheads out (the passes alone, as before them)."""
    inputs = load_cluster_inputs(db, run_id, rescale=rescale, overheads_on=overheads)
    c, reqs = inputs.cluster, inputs.requests
    arrival = reqs["t_arrival"].to_numpy().astype(float)
    span_s = float(reqs["t_done"].to_numpy().max() - arrival.min())
    with tempfile.TemporaryDirectory(prefix="pdlab-twin-") as tmp:
        trace = Path(tmp) / "requests.jsonl"
        lead_s, primed = write_trace(trace, reqs, inputs.profile)
        last = lead_s + float(arrival.max())
        cfg = SimConfig(
            workload=str(trace),
            workload_params={"block_tokens": c.block_tokens, "cycle": False},
            nodes=c.nodes,
            split=c.split,
            agents=1,  # unused: the trace's arrival times drive the run
            # the run ends when the last request finishes; this only bounds a runaway twin
            duration_s=min(last + 10.0 * span_s + 600.0, SIM_SECONDS.hi),
            warmup_s=0.0,
            planner="static",
            router=c.router,
            eviction=c.eviction,
            profile=inputs.profile,
            seed=seed,
            kv_fetch=c.kv_fetch,
            decode_binder=c.decode_binder,
            telemetry="compact",
            overheads=inputs.overheads,
        )
        t0 = time.perf_counter()
        sim = Simulator(cfg)
        sim.run()
        wall = time.perf_counter() - t0
    by_program = {r.program: r for r in sim.requests}
    first = 1 if primed else 0
    done = [by_program.get(f"mooncake-{first + i:06d}") for i in range(reqs.height)]
    missing = sum(r is None or r.t_done is None or r.t_first_token is None for r in done)
    if missing:
        raise ConfigError(
            f"the twin of run {inputs.run_id!r} left {missing} of {reqs.height} requests "
            "unfinished (the simulated cluster could not serve them)"
        )
    served: list[SimRequest] = [r for r in done if r is not None]
    t_out = reqs["t_out"].to_numpy().astype(float)
    real = Timings(
        arrival,
        t_out,
        reqs["t_first_token"].to_numpy().astype(float),
        reqs["t_done"].to_numpy().astype(float),
    )
    sim_t = Timings(
        arrival,
        t_out,
        np.array([r.t_first_token for r in served], dtype=float) - lead_s,
        np.array([r.t_done for r in served], dtype=float) - lead_s,
    )
    metrics = compare(real, sim_t, samples=samples, seed=seed)
    iterations = sum(n.prefill_iter + n.decode_iter for n in sim.nodes.values())
    twin_id = store_cluster_twin(db, inputs, served, sim_t, lead_s) if store else None
    return ClusterTwinResult(
        inputs.run_id, twin_id, inputs, metrics, wall, lead_s, served, iterations, real, sim_t
    )


def store_cluster_twin(
    db: str | Path, inputs: ClusterInputs, served: list[SimRequest], sim: Timings, lead_s: float
) -> str:
    """Write the simulated requests as run `twin-<run>[-n]` (source 'twin'), under the real
    request ids and on the real run's time axis; returns its id."""
    from toolkit.importers import BenchRun, write_runs

    rid = twin_run_id(db, inputs.run_id)
    prof = inputs.profile
    run = BenchRun(
        run_id=rid,
        started_at=datetime.now(UTC),
        source="twin",
        config={
            "twin_of": inputs.run_id,
            "kind": "cluster",
            "cluster": inputs.cluster.to_json(),
            "profile": {"prefill": list(prof.prefill), "decode": list(prof.decode)},
            "scale": list(inputs.scale),
            "lead_s": lead_s,
            "arrivals": "replayed",
        },
        node_names=[f"twin-node-{i}" for i in range(inputs.cluster.nodes)],
        hardware=prof.hardware,
        moe_top_k=prof.top_k if prof.num_experts else 0,
        moe_experts=prof.num_experts,
    )
    ids = inputs.requests["request_id"].to_list()
    for i, (rid_real, r) in enumerate(zip(ids, served, strict=True)):
        run.add_request(
            request_id=rid_real,
            program_id=rid_real,
            branch_id=rid_real,
            t_arrival=float(sim.t_arrival[i]),
            prefill_node=r.prefill_node,
            decode_node=r.decode_node,
            t_in=r.t_in,
            t_c=r.t_c,
            t_fetch=r.fetch_tokens,
            t_out=r.t_out,
            t_first_token=float(sim.t_first_token[i]),
            t_done=float(sim.t_done[i]),
        )
    write_runs(db, [run])
    return rid
