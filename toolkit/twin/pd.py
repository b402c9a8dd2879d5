"""`pdlab twin --what-if split=1P1D` (or `router=NAME`): the recorded workload on PD nodes.

The engine-setting what-ifs (toolkit.twin.whatif) replay the requests on the twin's engine
model; a PD split or a router needs the cluster simulator (cluster.sim) instead. Its nodes
get the recorded run's engine limits (SimConfig's engine limits: `max_num_seqs`,
`max_num_batched_tokens`, and the engine's KV capacity as GPU KV tokens per node), its
iteration times come from the same imported profile (its fitted forms), and the requests
are an open-loop trace of the recorded arrivals, input and output lengths (one single-turn
program each). Each node is one engine of the recorded TP degree.

The answer is relative, as for the other what-ifs: the cluster simulator replays the
workload twice, on the recorded layout (one collocated node per DP rank, default router)
as the baseline and under the change, and estimate = real * what-if / baseline; the
interval is `toolkit.twin.whatif.estimates`' paired bootstrap, widened by the larger of
the engine-model twin's error and the cluster simulator's own baseline error on the metric.
The simulator's nodes get the twin's pricer (the profile's grid with the recorded
interconnect), so with the engine limits every iteration is priced by the engine model's
rule, and the collocated baseline runs vLLM V1's mixed iterations (`cluster.sim.mixed`).
Like the engine model, the nodes keep no host KV (`host_kv=False`): each has one GPU pool
that its prefix cache and its running requests share (on a split, a decode node takes a
transferred request's KV into its pool when the request joins its batch). The baseline's
error then comes from what the two engines still model differently (the simulator's KV in
tokens, not blocks; which requests recompute preemption hits).
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from cluster.control import ROUTERS
from cluster.core import ConfigError, NullSink, parse_split
from cluster.hardware.profiles import load_profile
from cluster.sim.simulator import SimConfig, Simulator
from cluster.size_limits import SIM_SECONDS
from toolkit.twin.metrics import BOOTSTRAP_SAMPLES, Timings
from toolkit.twin.run import TwinResult
from toolkit.twin.whatif import PD_KEYS, WhatIfResult, estimates

# engine settings a PD what-if may change besides (they apply to every node)
PD_WITH = ("max_num_seqs", "max_num_batched_tokens")


def _nodes(split: str, dp: int) -> int:
    """Nodes of the what-if: one per DP rank when collocated, else X + Y of XPYD."""
    if split == "collocated":
        return dp
    try:
        p, d = (int(x) for x in split.upper().rstrip("D").split("P"))
    except ValueError:
        raise ConfigError(
            f"--what-if split={split!r}: expected XPYD (e.g. 1P1D) or collocated"
        ) from None
    parse_split(split, p + d)  # >= 1 of each
    return p + d


def _trace(base: TwinResult, directory: Path) -> tuple[Path, np.ndarray]:
    """The recorded requests as an Azure-format trace (arrivals from 0, in order)."""
    arr = np.array([q.arrival_s for q in base.requests], dtype=float)
    t0 = float(arr.min())
    path = directory / "recorded.csv"
    lines = ["arrived_at,num_prefill_tokens,num_decode_tokens"]
    lines += [
        f"{q.arrival_s - t0:.6f},{max(q.prompt_tokens, 1)},{q.output_tokens}" for q in base.requests
    ]
    path.write_text("\n".join(lines) + "\n")
    return path, arr - t0


def _simulate(cfg: SimConfig, arrivals: np.ndarray, t_out: np.ndarray) -> tuple[Timings, int]:
    """Per-request times of one cluster-simulator run (trace order) and its preemptions."""
    sim = Simulator(cfg, sink=NullSink())
    sim.run()
    first = np.full(len(arrivals), np.nan)
    done = np.full(len(arrivals), np.nan)
    for r in sim.requests:
        i = int(r.program.rsplit("-", 1)[1])
        first[i] = np.nan if r.t_first_token is None else r.t_first_token
        done[i] = np.nan if r.t_done is None else r.t_done
    if np.isnan(done).any():
        raise ConfigError(
            f"the cluster simulator left {int(np.isnan(done).sum())} of {len(done)} recorded "
            "requests unfinished"
        )
    return Timings(arrivals, t_out, first, done), sim.preemptions


def pd_what_if(
    base: TwinResult,
    profile: str | Path,
    changes: dict[str, Any],
    *,
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = 0,
) -> WhatIfResult:
    """Replay `base`'s requests on the cluster simulator under `changes` (module doc)."""
    other = sorted(set(changes) - set(PD_KEYS) - set(PD_WITH))
    if other:
        raise ConfigError(
            f"--what-if split=/router= combine only with {', '.join(PD_WITH)}, "
            f"not {', '.join(other)}"
        )
    router = changes.get("router")
    if router is not None and router not in ROUTERS:
        raise ConfigError(
            f"--what-if router={router!r}: choose one of {', '.join(ROUTERS.names())}"
        )
    inputs = base.inputs
    engine = inputs.engine
    # The twin's pricer: the profile's grid with the recorded interconnect (what the
    # collocated nodes' mixed iterations are priced with, as the engine model's are), and
    # the engine's KV block size (what a cached prefix and a request's blocks are made of).
    prof = replace(load_profile(str(profile)), pricer=inputs.pricer, block_tokens=engine.block_size)
    dp = engine.data_parallel_size
    split = str(changes.get("split", "collocated"))
    nodes = _nodes(split, dp)
    t_out = np.array([q.output_tokens for q in base.requests], dtype=float)
    seqs = engine.max_num_seqs or prof.max_decode_batch
    common: dict[str, Any] = dict(
        planner="static",
        profile=prof,
        arrival_rate_per_min=None,
        agents=1,
        duration_s=SIM_SECONDS.hi,  # the trace's end ends the run; this bounds a runaway
        warmup_s=0.0,
        telemetry="compact",
        l1_tokens=inputs.kv.tokens,
        host_kv=False,  # the engine's KV pool alone: the twin's engines keep no host KV
        max_num_seqs=seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        seed=seed,
    )
    with tempfile.TemporaryDirectory(prefix="pdlab-twin-") as tmp:
        trace, arrivals = _trace(base, Path(tmp))
        baseline_cfg = SimConfig(workload=str(trace), nodes=dp, split="collocated", **common)
        changed = common | {k: int(changes[k]) for k in PD_WITH if k in changes}
        alt_cfg = SimConfig(
            workload=str(trace),
            nodes=nodes,
            split=split,
            router=router or baseline_cfg.router,
            **changed,
        )
        alt_cfg.validate()  # a bad split or router fails before the baseline runs
        baseline, _ = _simulate(baseline_cfg, arrivals, t_out)
        alt, preemptions = _simulate(alt_cfg, arrivals, t_out)
    metrics = estimates(base, baseline, alt, samples=samples, seed=seed, own_error=True)
    settings = engine.with_overrides(**{k: changed[k] for k in PD_WITH if k in changes})
    return WhatIfResult(changes, settings, inputs.kv.blocks, metrics, preemptions)
