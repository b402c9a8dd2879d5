"""What a twin replay rests on: every parameter, its source, and how far it may be off.

`ReplayParameter(name, value, source, low, high, note, unit)`: `source` says where the value
comes from, and `low`..`high` (both None: exact) is the range the interval carries
(toolkit.twin.interval replays at both ends; `value` lies inside it):
- recorded: the run's own files state it (KV blocks vLLM allocated, CUDA graph sizes);
- described: the run's cluster description states it, but nothing measured it on the run
  (the interconnect of `cluster_config.json`); given: a flag the user passed;
- profile: the operator profile measured it; "fitted on run X": the profile fitted it in
  situ on run X (toolkit.profiles.torch_calibration); assumed: nothing measured it;
- estimated: computed from other facts (KV blocks from GPU memory);
- composed: summed from operators measured apart, with no measurement of the whole (an
  infinite end: the interval's sides are "not known").

`replay_parameters` lists the ones a replay of these settings depends on, each uncertain
quantity once:

| name | when | value and range (why) |
|---|---|---|
| `kv_blocks` | KV from GPU memory | vLLM's budget; `EngineSettings.kv_blocks_range`: the non-KV reserve x0.5..x2, a nominal memory size up to 3% less (a "24 GB" RTX 4090 shows 23.5 GiB) |
| `link_gbps`, `link_latency_s` | TP > 1, MoE with EP > 1, or a PD split's KV transfers | described / given: exact (their error is `collective_cost`'s); the profile's assumption: 8-64 GB/s (PCIe 4.0 x16 through the host to PCIe 5.0 x16 peer to peer) and 2-50 us per collective |
| `collective_cost` | same, link described or given | x0.8-1.25 on every collective's latency + bytes / bandwidth (one effective figure for every message size, where NCCL reaches its bus bandwidth only on large messages) |
| `expert_load_skew` | MoE with EP > 1 | the profile's (1 = balanced), 1.0-1.2 (the busiest rank's share of expert-token pairs: gates trained with a load-balancing loss, 128/EP experts averaged per rank) |
| `cpu_overhead` | always | 0, up to 1 x vidur's measurement of vLLM's `schedule` + `prepare_inputs` on an A100 host: 0.189 ms + 3.68 us per sequence (fit of `a100_cpu_overheads_commit-e2d00e9.csv`, batches 8-128; output processing left out, as vLLM V1 runs it in another process; async scheduling hides part or all of the rest) |
| `cuda_graph_saving_s` | unless the run says it ran eager | 0, up to cluster.hardware.profile_error.kernel_gap_s: the launch gaps CUDA graphs remove from the eager-mode profile |
| `moe_block` | an MoE block composed from per-expert operators (the layers.csv layout) | x1, range 0 to not known: the engine's fused MoE was never measured (cluster.hardware.profile_error.moe_composed), so its time has no measured bound above; the interval's sides are then "not known" |
| `cuda_graph_max_batch` | DP ranks in step | recorded, or 0 (no DP padding) in 0-512 (vLLM's largest default capture size) |

`vary(setup, parameter, value)` is a `ReplaySetup` (what one engine's replay runs with) with
one parameter at another value; `with_parameters(inputs, {name: value})` the same on a run's
`EngineInputs` (the interval's sweep; `toolkit.twin.run.replay_inputs` replays them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, NamedTuple

from cluster.core import ConfigError
from cluster.hardware.engine_settings import EngineSettings, KvCapacity
from cluster.hardware.model_shape import ModelShape
from cluster.hardware.pricer import IterationPricer
from cluster.hardware.profile_error import kernel_gap_s, moe_composed, with_moe_scaled
from cluster.sim.engine_model import IterationOverhead
from cluster.sim.engine_model.replay import steps_together

if TYPE_CHECKING:
    from toolkit.twin.engine_inputs import EngineInputs

LINK_GBPS_RANGE = (8.0, 64.0)
LINK_LATENCY_RANGE_S = (2e-6, 50e-6)
COLLECTIVE_COST_RANGE = (0.8, 1.25)
SKEW_RANGE = (1.0, 1.2)
CPU_PER_ITERATION_S = 0.189e-3  # vidur A100: schedule + prepare_inputs, intercept
CPU_PER_SEQUENCE_S = 3.68e-6  # ... and slope per sequence in the batch
CUDA_GRAPH_RANGE = (0, 512)


@dataclass(frozen=True, slots=True)
class ReplayParameter:
    """One parameter of a replay (module docstring); low/high None = exact."""

    name: str
    value: float
    source: str  # recorded | described | given | profile | assumed | estimated | composed
    low: float | None = None
    high: float | None = None
    note: str = ""
    unit: str = ""

    @property
    def ranged(self) -> bool:
        return self.low is not None and self.high is not None and self.low != self.high

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "unit": self.unit,
            "source": self.source,
            "low": self.low,
            "high": self.high,  # inf (JSON: null with "ranged") = no measured bound
            "ranged": self.ranged,
            "note": self.note,
        }


class ReplaySetup(NamedTuple):
    """What one engine's replay runs with (a run's, or one instance's of a cluster)."""

    engine: EngineSettings
    kv_blocks: int
    pricer: IterationPricer
    overhead: IterationOverhead


def _kv(
    engine: EngineSettings, shape: ModelShape, kv: KvCapacity, nominal: bool
) -> ReplayParameter:
    if kv.source != "GPU memory":
        return ReplayParameter("kv_blocks", kv.blocks, "recorded", note=kv.source, unit="blocks")
    low, high = engine.kv_blocks_range(shape, nominal_memory=nominal)
    where = "a nominal memory size (up to 3% less)" if nominal else "the device's memory"
    reserve = engine.non_kv_reserve_bytes(shape) / 2**30
    return ReplayParameter(
        "kv_blocks", kv.blocks, "estimated", min(low, kv.blocks), max(high, kv.blocks),
        f"vLLM's budget per DP rank from {where}; non-KV reserve {reserve:.2f} GiB x0.5-2",
        "blocks",
    )  # fmt: skip


def _link(pricer: IterationPricer, link: str) -> list[ReplayParameter]:
    par = pricer.parallel
    if link.startswith("profile ("):  # measured with the profile, or fitted in situ on a run
        how = link[len("profile (") :].split(":")[0]
        src = how if how.startswith("fitted on run") else "profile"
        return [
            ReplayParameter("link_gbps", par.link_gbps, src, note=link, unit="GB/s"),
            ReplayParameter("link_latency_s", par.link_latency_s, src, note=link, unit="s"),
        ]
    if link.startswith("profile"):
        return [
            ReplayParameter("link_gbps", par.link_gbps, "assumed", *LINK_GBPS_RANGE, link, "GB/s"),
            ReplayParameter(
                "link_latency_s", par.link_latency_s, "assumed", *LINK_LATENCY_RANGE_S, link, "s"
            ),
        ]
    src = "given" if link == "flags" else "described"
    return [
        ReplayParameter("link_gbps", par.link_gbps, src, note=link, unit="GB/s"),
        ReplayParameter("link_latency_s", par.link_latency_s, src, note=link, unit="s"),
        ReplayParameter(
            "collective_cost", 1.0, "assumed", *COLLECTIVE_COST_RANGE,
            "not measured: one link figure for every message size", "x each collective's time",
        ),
    ]  # fmt: skip


def replay_parameters(
    engine: EngineSettings,
    shape: ModelShape,
    pricer: IterationPricer,
    kv: KvCapacity,
    link: str,
    *,
    eager: bool = False,
    nominal_memory: bool = True,
    kv_transfers: bool = False,
) -> tuple[ReplayParameter, ...]:
    """The parameters a replay of `engine` depends on (module docstring's table).

    `link` says where the collectives' link comes from (toolkit.twin.engine_inputs), `eager`
    whether the run recorded that it ran without CUDA graphs, `nominal_memory` whether its
    GPU memory is a nominal size rather than the device's, `kv_transfers` whether the
    engine sends or receives KV over that link (an instance of a PD split)."""
    par = pricer.parallel
    out = [_kv(engine, shape, kv, nominal_memory)]
    expert_parallel = shape.is_moe and engine.expert_parallel_size > 1
    if engine.tensor_parallel_size > 1 or expert_parallel or kv_transfers:
        out += _link(pricer, link)
    if expert_parallel and pricer.tables.moe_kind != "per-ep-rank":  # else the table's own
        out.append(
            ReplayParameter(
                "expert_load_skew", par.expert_load_skew, "assumed", SKEW_RANGE[0],
                max(SKEW_RANGE[1], par.expert_load_skew),
                "the busiest EP rank's expert-token pairs over the mean (routing not measured)",
                "busiest rank / mean",
            )
        )  # fmt: skip
    out.append(
        ReplayParameter(
            "cpu_overhead", 0.0, "assumed", 0.0, 1.0,
            "CPU per iteration outside the profiled operators: up to vidur's A100 schedule + "
            "prepare_inputs", "x (0.189 ms + 3.68 us/seq)",
        )
    )  # fmt: skip
    if not eager:
        out.append(
            ReplayParameter(
                "cuda_graph_saving_s", 0.0, "assumed", 0.0, kernel_gap_s(pricer.tables, shape),
                "eager profile: CUDA graphs remove up to one launch gap per kernel",
                "s per iteration",
            )
        )  # fmt: skip
    if moe_composed(pricer.tables):
        out.append(
            ReplayParameter(
                "moe_block", 1.0, "composed", 0.0, math.inf,
                "the MoE block is summed from separately timed expert operators; the engine's "
                "fused MoE (routing, permutation, grouped GEMMs) was not measured",
                "x the composed block's time",
            )
        )  # fmt: skip
    if steps_together(engine, pricer):
        graphs = engine.cuda_graph_max_batch
        out.append(
            ReplayParameter(
                "cuda_graph_max_batch", graphs or 0, "recorded" if graphs else "assumed",
                *((None, None) if graphs else CUDA_GRAPH_RANGE),
                "DP ranks pad to the largest rank's tokens when all fit a CUDA graph", "tokens",
            )
        )  # fmt: skip
    return tuple(out)


def _with_parallel(pricer: IterationPricer, **changes: float) -> IterationPricer:
    return IterationPricer(
        pricer.tables, pricer.shape, replace(pricer.parallel, **changes), pricer.memory_gbps
    )


def vary(setup: ReplaySetup, p: ReplayParameter, value: float) -> ReplaySetup:
    """`setup` with parameter `p` (now at `p.value`) at `value` instead."""
    o, par = setup.overhead, setup.pricer.parallel
    match p.name:
        case "kv_blocks":
            return setup._replace(kv_blocks=max(int(value), 1))
        case "link_gbps" | "link_latency_s" | "expert_load_skew":
            return setup._replace(pricer=_with_parallel(setup.pricer, **{p.name: float(value)}))
        case "collective_cost":
            f = value / p.value
            return setup._replace(
                pricer=_with_parallel(
                    setup.pricer,
                    link_gbps=par.link_gbps / f,
                    link_latency_s=par.link_latency_s * f,
                )
            )
        case "cpu_overhead":
            d = value - p.value
            return setup._replace(
                overhead=IterationOverhead(
                    o.per_iteration_s + d * CPU_PER_ITERATION_S,
                    o.per_sequence_s + d * CPU_PER_SEQUENCE_S,
                )
            )
        case "cuda_graph_saving_s":
            per_iteration = o.per_iteration_s - (value - p.value)
            return setup._replace(overhead=IterationOverhead(per_iteration, o.per_sequence_s))
        case "moe_block":
            t = with_moe_scaled(setup.pricer.tables, value / p.value)
            pr = setup.pricer
            return setup._replace(pricer=IterationPricer(t, pr.shape, pr.parallel, pr.memory_gbps))
        case "cuda_graph_max_batch":
            engine = replace(setup.engine, cuda_graph_max_batch=int(value) or None)
            return setup._replace(engine=engine)
    raise ConfigError(f"replay parameter {p.name!r} cannot be varied")


def setup_of(inputs: EngineInputs) -> ReplaySetup:
    return ReplaySetup(inputs.engine, inputs.kv.blocks, inputs.pricer, inputs.overhead)


def with_parameters(inputs: EngineInputs, changes: dict[str, float]) -> EngineInputs:
    """`inputs` with the named parameters set to new values (their sources kept)."""
    known = {p.name: p for p in inputs.parameters}
    unknown = sorted(set(changes) - set(known))
    if unknown:
        raise ConfigError(
            f"replay parameters: unknown {', '.join(unknown)}; this replay has "
            f"{', '.join(known) or 'none'}"
        )
    setup = setup_of(inputs)
    for name, value in changes.items():
        setup = vary(setup, known[name], float(value))
    kv = inputs.kv
    if setup.kv_blocks != kv.blocks:
        kv = kv._replace(tokens=setup.kv_blocks * setup.engine.block_size, blocks=setup.kv_blocks)
    params = tuple(
        replace(p, value=float(changes[p.name])) if p.name in changes else p
        for p in inputs.parameters
    )
    return inputs._replace(
        engine=setup.engine, pricer=setup.pricer, kv=kv, overhead=setup.overhead,
        parameters=params,
    )  # fmt: skip
