"""What a twin replay assumed: every parameter no data measured, with its source and range.

`ReplayParameter(name, value, source, low, high, note)`: `source` is "recorded" (the run's
own record, or a flag the user gave), "profile" (the operator profile measured it),
"fitted on run X" (the profile fitted it in situ on run X) or "assumed" (nothing measured
it; `low`..`high` is a plausible range, `value` inside it).
`replay_parameters` lists the ones a replay of these settings depends on:

| name | when | assumed value and range (why) |
|---|---|---|
| `link_gbps` | TP > 1, or MoE with EP > 1 | the profile's link, PCIe class, 8-64 GB/s (PCIe 4.0 x16 through the host to PCIe 5.0 x16 peer to peer) |
| `link_latency_s` | same | the profile's, 2-50 us per collective |
| `expert_load_skew` | MoE with EP > 1 | the profile's (1 = balanced), 1.0-1.2 (the busiest rank's share of expert-token pairs: gates trained with a load-balancing loss, 128/EP experts averaged per rank) |
| `cpu_overhead_per_iteration_s` | always | 0 (the profile is eager GPU operator time: CUDA graphs save about what the CPU adds; the dense runs we have replay within 2% with 0), 0-2 ms |
| `kv_blocks` | KV from GPU memory | vLLM's budget (`EngineSettings.kv_blocks_range`: reserve x0.5..x2, memory -2%) |
| `cuda_graph_max_batch` | DP ranks in step | 0 when not recorded (no DP padding), 0-512 (vLLM's largest default capture size) |

`with_parameters(inputs, {name: value})` gives the inputs of a replay under other values
(the interval's sweep); `toolkit.twin.replay_inputs` replays them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from cluster.core import ConfigError
from cluster.hardware.engine import EngineSettings, KvCapacity
from cluster.hardware.model_shape import ModelShape
from cluster.hardware.pricer import IterationPricer
from cluster.sim.engine_model import IterationOverhead
from cluster.sim.engine_model.replay import steps_together

if TYPE_CHECKING:
    from toolkit.engine_inputs import EngineInputs

LINK_GBPS_RANGE = (8.0, 64.0)
LINK_LATENCY_RANGE_S = (2e-6, 50e-6)
SKEW_RANGE = (1.0, 1.2)
CPU_OVERHEAD_RANGE_S = (0.0, 0.002)
CUDA_GRAPH_RANGE = (0, 512)


@dataclass(frozen=True, slots=True)
class ReplayParameter:
    """One parameter of a replay (module docstring); low/high only for assumed ones."""

    name: str
    value: float
    source: str  # 'recorded' | 'profile' | 'assumed'
    low: float | None = None
    high: float | None = None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "source": self.source,
            "low": self.low,
            "high": self.high,
            "note": self.note,
        }


def replay_parameters(
    engine: EngineSettings,
    shape: ModelShape,
    pricer: IterationPricer,
    kv: KvCapacity,
    link: str,
    overhead: IterationOverhead,
) -> tuple[ReplayParameter, ...]:
    """The parameters a replay of `engine` depends on (module docstring's table)."""
    out: list[ReplayParameter] = []
    par = pricer.parallel
    expert_parallel = shape.is_moe and engine.expert_parallel_size > 1
    if engine.tensor_parallel_size > 1 or expert_parallel:
        src = "assumed" if link == "profile's assumption" else "recorded"
        if link.startswith("profile ("):  # measured with the profile, or fitted on a run
            fitted = link[len("profile (") :].split(":")[0]
            src = fitted if fitted.startswith("fitted on run") else "profile"
        rng = src == "assumed"
        out += [
            ReplayParameter(
                "link_gbps", par.link_gbps, src, *(LINK_GBPS_RANGE if rng else (None, None)), link
            ),
            ReplayParameter(
                "link_latency_s",
                par.link_latency_s,
                src,
                *(LINK_LATENCY_RANGE_S if rng else (None, None)),
                link,
            ),
        ]
    if expert_parallel:
        skew = max(par.expert_load_skew, SKEW_RANGE[0])
        out.append(
            ReplayParameter(
                "expert_load_skew",
                par.expert_load_skew,
                "assumed",
                SKEW_RANGE[0],
                max(SKEW_RANGE[1], skew),
                "busiest EP rank's expert-token pairs over the mean (no data measured routing)",
            )
        )
    cpu = overhead.per_iteration_s
    out.append(
        ReplayParameter(
            "cpu_overhead_per_iteration_s",
            cpu,
            "assumed",
            min(CPU_OVERHEAD_RANGE_S[0], cpu),
            max(CPU_OVERHEAD_RANGE_S[1], cpu),
            "engine time outside the profiled operators, net of CUDA graphs",
        )
    )
    if kv.source == "GPU memory":
        low, high = engine.kv_blocks_range(shape)
        out.append(
            ReplayParameter(
                "kv_blocks",
                kv.blocks,
                "assumed",
                min(low, kv.blocks),
                max(high, kv.blocks),
                "vLLM's KV budget from GPU memory, per DP rank (experts split over EP)",
            )
        )
    else:
        out.append(ReplayParameter("kv_blocks", kv.blocks, "recorded", note=kv.source))
    if steps_together(engine, pricer):
        graphs = engine.cuda_graph_max_batch
        out.append(
            ReplayParameter(
                "cuda_graph_max_batch",
                graphs or 0,
                "recorded" if graphs else "assumed",
                *((None, None) if graphs else CUDA_GRAPH_RANGE),
                "DP ranks pad to the largest rank's tokens when all fit a CUDA graph",
            )
        )
    return tuple(out)


def with_parameters(inputs: EngineInputs, changes: dict[str, float]) -> EngineInputs:
    """`inputs` with the named parameters set to new values (their sources kept)."""
    known = {p.name: p for p in inputs.parameters}
    unknown = sorted(set(changes) - set(known))
    if unknown:
        raise ConfigError(
            f"replay parameters: unknown {', '.join(unknown)}; this replay has "
            f"{', '.join(known) or 'none'}"
        )
    par = inputs.pricer.parallel
    new_par = replace(
        par,
        link_gbps=float(changes.get("link_gbps", par.link_gbps)),
        link_latency_s=float(changes.get("link_latency_s", par.link_latency_s)),
        expert_load_skew=float(changes.get("expert_load_skew", par.expert_load_skew)),
    )
    pricer = inputs.pricer
    if new_par != par:
        pricer = IterationPricer(pricer.tables, pricer.shape, new_par)
    overhead = inputs.overhead
    if "cpu_overhead_per_iteration_s" in changes:
        overhead = replace(overhead, per_iteration_s=float(changes["cpu_overhead_per_iteration_s"]))
    kv, engine = inputs.kv, inputs.engine
    if "kv_blocks" in changes:
        blocks = int(changes["kv_blocks"])
        kv = kv._replace(tokens=blocks * engine.block_size, blocks=blocks)
    if "cuda_graph_max_batch" in changes:
        engine = replace(engine, cuda_graph_max_batch=int(changes["cuda_graph_max_batch"]) or None)
    params = tuple(
        replace(p, value=float(changes[p.name])) if p.name in changes else p
        for p in inputs.parameters
    )
    return inputs._replace(
        engine=engine, pricer=pricer, kv=kv, overhead=overhead, parameters=params
    )
