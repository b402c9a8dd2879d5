"""`pdlab twin --what-if KEY=VALUE`: the recorded workload under other engine settings.

The twin replays the recorded requests twice: with the recorded settings (the baseline,
compared with the real run by `toolkit.twin.run`) and with the changed ones. The answer for
each metric is the real value scaled by the replay's ratio, estimate = real * whatif /
baseline, so that the twin's error on this run cancels to first order. Its interval
combines two things:
- the spread over the workload: the paired bootstrap of toolkit.twin.metrics (one resample
  of requests applied to real, baseline and what-if alike), 2.5th..97.5th percentiles of
  the estimate;
- the twin's measured error: that interval widened by |error| of the baseline replay on the
  same metric (the twin is no more trusted under new settings than under the recorded).
The replay is deterministic (recorded arrivals and ranks; no random draw), so there is no
seed spread to add. `WHAT_IF_KEYS` are settings of the collocated engines; `split=XPYD`
and `router=NAME` (`PD_KEYS`) replay on the cluster simulator's PD nodes instead
(toolkit.twin.pd), with the same estimate and interval (`estimates`).
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, NamedTuple

import numpy as np

from cluster import size_limits as limits
from cluster.core import ConfigError
from cluster.hardware.engine_settings import GIB, EngineSettings
from cluster.hardware.pricer import IterationPricer
from cluster.sim.engine_model import replay
from toolkit.twin.metrics import (
    BOOTSTRAP_SAMPLES,
    Timings,
    bootstrap_indices,
    interval,
    metric_values,
)
from toolkit.twin.run import TwinResult, sim_timings

# engine settings a what-if may change, plus the GPU memory that sets KV capacity
WHAT_IF_KEYS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "num_gpu_blocks",
    "data_parallel_size",
    "block_size",
    "enable_prefix_caching",
    "long_prefill_token_threshold",
    "reserve_full_prompt",
    "enable_chunked_prefill",
    "gpu_memory_gib",
    "gpu_memory_utilization",
)
PD_KEYS = ("split", "router")  # the cluster simulator's (toolkit.twin.pd)
# Ceilings of the numeric keys; the engine settings check the rest again when built.
WHAT_IF_LIMITS = {
    "max_num_seqs": limits.MAX_NUM_SEQS,
    "max_num_batched_tokens": limits.BATCHED_TOKENS,
    "num_gpu_blocks": limits.KV_BLOCKS,
    "data_parallel_size": limits.DATA_PARALLEL,
    "block_size": limits.BLOCK_SIZE,
    "long_prefill_token_threshold": limits.Limit(0, limits.MODEL_LEN.hi, "tokens"),
    "gpu_memory_gib": limits.GPU_MEMORY_GIB,
    "gpu_memory_utilization": limits.UTILIZATION,
}


class WhatIfMetric(NamedTuple):
    real: float  # the recorded run
    baseline_sim: float  # replay with the recorded settings
    what_if_sim: float  # replay with the changed settings
    estimate: float  # real * what_if_sim / baseline_sim
    ci95: tuple[float, float]
    change: float  # estimate / real - 1


class WhatIfResult(NamedTuple):
    changes: dict[str, Any]
    engine: EngineSettings
    kv_blocks: int
    metrics: dict[str, WhatIfMetric]
    preemptions: int

    def to_json(self) -> dict[str, Any]:
        return {
            "changes": self.changes,
            "kv_blocks": self.kv_blocks,
            "preemptions": self.preemptions,
            "metrics": {
                k: {
                    "real": m.real,
                    "baseline_sim": m.baseline_sim,
                    "what_if_sim": m.what_if_sim,
                    "estimate": m.estimate,
                    "ci95": list(m.ci95),
                    "change": m.change,
                }
                for k, m in self.metrics.items()
            },
        }


def parse_changes(items: list[str]) -> dict[str, Any]:
    """KEY=VALUE strings to typed values (ConfigError naming the key and what is allowed)."""
    types = {f.name: f.type for f in fields(EngineSettings)}
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in WHAT_IF_KEYS + PD_KEYS:
            raise ConfigError(
                f"--what-if {item!r}: expected KEY=VALUE with KEY one of "
                f"{', '.join(WHAT_IF_KEYS + PD_KEYS)}"
            )
        if key in PD_KEYS:
            out[key] = raw.strip()
            continue
        kind = "float" if key.startswith("gpu_memory") else str(types.get(key, ""))
        try:
            if "bool" in kind:
                if raw.lower() not in ("true", "false", "1", "0", "on", "off"):
                    raise ValueError(raw)
                out[key] = raw.lower() in ("true", "1", "on")
            elif "float" in kind:
                out[key] = float(raw)
            else:
                out[key] = int(raw)
        except ValueError:
            raise ConfigError(f"--what-if {item!r}: {raw!r} is not a valid {key}") from None
        limit = WHAT_IF_LIMITS.get(key)
        if limit is not None:  # before anything is allocated (cluster.size_limits)
            limit.check(f"--what-if {key}", out[key])
    return out


def what_if(
    base: TwinResult,
    changes: dict[str, Any],
    *,
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = 0,
) -> WhatIfResult:
    """Replay `base`'s requests under `changes` and estimate the metrics (module docstring)."""
    if not changes:
        raise ConfigError("--what-if needs at least one KEY=VALUE")
    inputs = base.inputs
    memory = {k: changes[k] for k in ("gpu_memory_gib", "gpu_memory_utilization") if k in changes}
    settings = {k: v for k, v in changes.items() if k not in memory}
    engine = inputs.engine.with_overrides(
        **settings,
        gpu_memory_bytes=int(memory["gpu_memory_gib"] * GIB)
        if "gpu_memory_gib" in memory
        else None,
        gpu_memory_utilization=memory.get("gpu_memory_utilization"),
    )
    if memory and "num_gpu_blocks" not in settings:
        kv_blocks = engine.kv_capacity(
            inputs.shape, engine.non_kv_reserve_bytes(inputs.shape)
        ).blocks
    elif "num_gpu_blocks" in settings:
        kv_blocks = int(settings["num_gpu_blocks"])
    else:  # same KV memory, maybe cut in other blocks
        kv_blocks = inputs.kv.blocks * inputs.engine.block_size // engine.block_size
    old = inputs.engine
    if (
        old.expert_parallel_size > 1
        and old.expert_parallel_size == old.tensor_parallel_size * old.data_parallel_size
        and "expert_parallel_size" not in settings
        and engine.data_parallel_size != old.data_parallel_size
    ):  # vLLM's expert parallelism spans every rank: EP follows DP, and so do the experts
        engine = replace(
            engine, expert_parallel_size=engine.tensor_parallel_size * engine.data_parallel_size
        )
        if "num_gpu_blocks" not in settings:
            freed = old.weight_bytes(inputs.shape) - engine.weight_bytes(inputs.shape)
            kv_blocks += int(freed // (engine.kv_bytes_per_token(inputs.shape) * engine.block_size))
    reqs = base.requests
    if engine.data_parallel_size != inputs.engine.data_parallel_size:
        reqs = [q._replace(engine=None) for q in reqs]  # recorded ranks no longer apply
    pricer = inputs.pricer
    par = replace(
        pricer.parallel, dp=engine.data_parallel_size, ep=engine.expert_parallel_size
    )  # MoE: the EP group grows with DP
    if par != pricer.parallel:
        pricer = IterationPricer(pricer.tables, pricer.shape, par)
    engines = replay(reqs, engine, kv_blocks, pricer, inputs.overhead)
    alt = sim_timings(reqs, engines)
    metrics = estimates(base, base.sim, alt, samples=samples, seed=seed)
    return WhatIfResult(
        changes, engine, kv_blocks, metrics, sum(e.num_preemptions for e in engines)
    )


def estimates(
    base: TwinResult,
    baseline: Timings,
    alt: Timings,
    *,
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = 0,
    own_error: bool = False,
) -> dict[str, WhatIfMetric]:
    """Each metric's estimate real * alt / baseline and its interval (module docstring);
    `baseline` and `alt` are replays of `base`'s requests in their order. With `own_error`
    (a baseline from another simulator than the twin's) the interval is widened by the
    larger of the twin's error and the baseline's own error against the real run."""
    idx = bootstrap_indices(len(base.requests), samples, seed)
    r = metric_values(base.real, idx)
    b = metric_values(baseline, idx)
    w = metric_values(alt, idx)
    metrics = {}
    for name, (rv, rb) in r.items():
        bv, bb = b[name]
        wv, wb = w[name]
        estimate = rv * wv / bv if bv else float("nan")
        with np.errstate(divide="ignore", invalid="ignore"):
            lo, hi = interval(rb * wb / bb)
        slack = abs(base.metrics[name].error)
        if own_error and rv:
            slack = max(slack, abs(bv / rv - 1))
        ci = (lo * (1 - slack), hi * (1 + slack))
        change = estimate / rv - 1 if rv else float("nan")
        metrics[name] = WhatIfMetric(rv, bv, wv, estimate, ci, change)
    return metrics
