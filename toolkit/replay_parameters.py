"""The parameters a twin replay rests on, where each comes from, and how far it may be off.

Each `ReplayParameter` has the value the replay used, its source and, where no data pins it,
a low..high range that the interval carries (toolkit.twin_interval replays at both ends):
- recorded: the run's files state it (KV blocks vLLM allocated): exact, no range;
- described: the run's cluster description states it, but nothing measured it on the run
  (the interconnect of `cluster_config.json`); its range is the model's own error;
- profile / assumed: the profile's default or an assumption of the twin (the link of a
  profile, the CPU time per iteration, CUDA graphs);
- estimated: computed from other facts (KV blocks from GPU memory).

The parameters and their ranges:
- `kv_blocks` (estimated from GPU memory): vLLM's budget with the non-KV reserve (activation
  peak, sampler logits, CUDA graphs and non-torch memory; cluster.hardware.engine) at
  0.5x..1.5x its estimate (`RESERVE_RANGE`; on the RTX 4090 run the estimate was within 3%
  of what vLLM kept, one point), and a nominal memory size (a flag, a cluster description,
  "24 GB") at 97..100% (`NOMINAL_MEMORY_RANGE`: GPUs report a little less than their label,
  23.5 GiB on a 24 GiB RTX 4090); a device-reported size is exact.
- `collective_cost` (TP all-reduce, EP dispatch/combine; only when the replay has
  collectives): a factor on the pricer's latency + bytes / bandwidth cost of every
  collective (bandwidth / f, latency * f), which no profile measures. With a described link
  x0.8..1.25 (one effective figure for every message size, where NCCL reaches its bus
  bandwidth only on large messages); with the profile's assumed link x0.5..2. The link's
  bandwidth and latency are listed too, with their source (`link_gbps`, `link_latency_s`;
  a list may also range them one by one: `variant` takes either).
- `cpu_overhead`: CPU time per iteration outside the profiled operators (the scheduler and
  input preparation), 0 in the replay; up to vidur's measurement of vLLM's `schedule` +
  `prepare_inputs` on an A100 host, 0.189 ms + 3.68 us per sequence (fit of
  `a100_cpu_overheads_commit-e2d00e9.csv`, batches 8-128; output processing left out, as
  vLLM V1 runs it in another process; async scheduling hides part or all of the rest).
- `cuda_graph_saving_s`: the launch gaps CUDA graphs remove against the eager-mode profile,
  0 in the replay, up to cluster.hardware.profile_error.kernel_gap_s; none when the run's
  config says it ran eager (`enforce_eager`).
- `expert_load_skew` (MoE with EP > 1): the busiest rank's tokens over the mean; the
  profile's value, range 1..max(1.5, value) (assumed: routing skew is not measured).
`variant(setup, name, value)` is the replay setup with one parameter changed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, NamedTuple

from cluster.core import ConfigError
from cluster.hardware.engine import EngineSettings
from cluster.hardware.pricer import IterationPricer
from cluster.hardware.profile_error import kernel_gap_s
from cluster.sim.engine_model import IterationOverhead

RESERVE_RANGE = (0.5, 1.5)
NOMINAL_MEMORY_RANGE = (0.97, 1.0)
DESCRIBED_LINK = (0.8, 1.25)  # collective cost factor, link described by the run
ASSUMED_LINK = (0.5, 2.0)  # ... link assumed by the profile
CPU_PER_ITERATION_S = 0.189e-3  # vidur A100: schedule + prepare_inputs, intercept
CPU_PER_SEQUENCE_S = 3.68e-6  # ... and slope per sequence in the batch
SKEW_HIGH = 1.5


class ReplayParameter(NamedTuple):
    """One parameter of a replay (module docstring); low/high None = exact."""

    name: str
    value: float
    unit: str
    source: str  # recorded | described | profile | assumed | estimated
    low: float | None
    high: float | None
    note: str

    @property
    def ranged(self) -> bool:
        return self.low is not None and self.high is not None and self.low != self.high

    def to_json(self) -> dict[str, Any]:
        return self._asdict()


class ReplaySetup(NamedTuple):
    """What one replay runs with."""

    engine: EngineSettings
    kv_blocks: int
    pricer: IterationPricer
    overhead: IterationOverhead


def _with_link(pricer: IterationPricer, **changes: float) -> IterationPricer:
    return IterationPricer(pricer.tables, pricer.shape, replace(pricer.parallel, **changes))


def variant(setup: ReplaySetup, name: str, value: float) -> ReplaySetup:
    """`setup` with parameter `name` at `value` (ConfigError for an unknown name)."""
    o = setup.overhead
    match name:
        case "kv_blocks":
            return setup._replace(kv_blocks=max(int(value), 1))
        case "link_gbps" | "link_latency_s" | "expert_load_skew":
            return setup._replace(pricer=_with_link(setup.pricer, **{name: float(value)}))
        case "collective_cost":
            par = setup.pricer.parallel
            return setup._replace(
                pricer=_with_link(
                    setup.pricer,
                    link_gbps=par.link_gbps / value,
                    link_latency_s=par.link_latency_s * value,
                )
            )
        case "cpu_overhead":
            return setup._replace(
                overhead=IterationOverhead(
                    o.per_iteration_s + value * CPU_PER_ITERATION_S,
                    o.per_sequence_s + value * CPU_PER_SEQUENCE_S,
                )
            )
        case "cuda_graph_saving_s":
            return setup._replace(
                overhead=IterationOverhead(o.per_iteration_s - value, o.per_sequence_s)
            )
    raise ConfigError(f"unknown replay parameter {name!r}")


def _kv(inputs: Any, config: dict[str, Any], memory_flag: bool) -> ReplayParameter:
    kv, engine, shape = inputs.kv, inputs.engine, inputs.shape
    if kv.source.startswith("recorded"):
        return ReplayParameter(
            "kv_blocks", kv.blocks, "blocks", "recorded", None, None, "vLLM's allocation"
        )
    nominal = memory_flag or config.get("gpu_memory_source") != "device"
    reserve = engine.non_kv_reserve_bytes(shape)
    mem = engine.gpu_memory_bytes or 0

    def blocks(mem_factor: float, reserve_factor: float) -> int:
        e = engine.with_overrides(gpu_memory_bytes=max(int(mem * mem_factor), 1))
        try:
            return e.kv_capacity(shape, reserve_bytes=int(reserve * reserve_factor)).blocks
        except ConfigError:
            return 0  # no room for KV at this end: the interval says it does not know

    low = blocks(NOMINAL_MEMORY_RANGE[0] if nominal else 1.0, RESERVE_RANGE[1])
    high = blocks(1.0, RESERVE_RANGE[0])
    where = "nominal memory (97-100%)" if nominal else "device memory"
    return ReplayParameter(
        "kv_blocks", kv.blocks, "blocks", "estimated", low, high,
        f"vLLM's budget from {where}; non-KV reserve {reserve / 2**30:.2f} GiB x0.5-1.5",
    )  # fmt: skip


def replay_parameters(
    inputs: Any, config: dict[str, Any], *, memory_flag: bool = False
) -> list[ReplayParameter]:
    """The parameters of the replay of `inputs` (toolkit.engine_inputs.EngineInputs)."""
    pricer, shape = inputs.pricer, inputs.shape
    par = pricer.parallel
    out = [_kv(inputs, config, memory_flag)]
    collectives = par.tp > 1 or (par.ep > 1 and shape.is_moe)
    if collectives:
        described = not inputs.link.startswith("profile")
        lo, hi = DESCRIBED_LINK if described else ASSUMED_LINK
        source = "described" if described else "assumed"
        for name, unit in (("link_gbps", "GB/s"), ("link_latency_s", "s")):
            v = float(getattr(par, name))
            out.append(ReplayParameter(name, v, unit, source, None, None, inputs.link))
        out.append(
            ReplayParameter(
                "collective_cost", 1.0, "x each collective's time", source, lo, hi,
                "not measured; one link figure for every message size",
            )
        )  # fmt: skip
    if shape.is_moe and par.ep > 1:
        skew = float(par.expert_load_skew)
        out.append(
            ReplayParameter(
                "expert_load_skew", skew, "busiest rank / mean", "assumed", 1.0,
                max(SKEW_HIGH, skew), "routing skew is not measured",
            )
        )  # fmt: skip
    out.append(
        ReplayParameter(
            "cpu_overhead", 0.0, "x (0.189 ms + 3.68 us/seq)", "assumed", 0.0, 1.0,
            "CPU per iteration: up to vidur's A100 schedule + prepare_inputs",
        )
    )  # fmt: skip
    if not config.get("enforce_eager"):
        gap = kernel_gap_s(pricer.tables, shape)
        out.append(
            ReplayParameter(
                "cuda_graph_saving_s", 0.0, "s per iteration", "assumed", 0.0, gap,
                "eager profile: up to one launch gap per kernel",
            )
        )  # fmt: skip
    return out
