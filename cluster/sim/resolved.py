"""A `SimConfig` resolved for one run (SPEC §5): checked, its defaults applied, its profile
and policies loaded and its workload opened, so that `Simulator` only wires layers.

`SimConfig.resolve()` returns a `ResolvedConfig`; every ConfigError a run can raise at
start-up comes from here (or from a layer's own constructor: router, planner and decode
binder names are checked where the control plane creates them). Policies are loaded
instances (stateful, paper 003 §3): one `ResolvedConfig` serves one simulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cluster.core import ConfigError, Phase
from cluster.hardware.profiles import HardwareProfile, load_profile
from cluster.policies.loader import Family, LoadedPolicy, load_policy
from cluster.policies.scheduling import FCFS
from cluster.workloads import WorkloadSource, make_workload

if TYPE_CHECKING:  # the config calls down to `resolve` (cluster/sim/config.py)
    from cluster.sim.config import SimConfig

DEFAULT_FETCH = {"ttft": "async"}  # other routers: engines with private caches (SGLang PD)
DEFAULT_BINDER = {"ttft": "fewest"}  # other routers: the gateway's round-robin decode routing


@dataclass(frozen=True, slots=True)
class ResolvedConfig:
    """What a run is built from: the config, the hardware profile with the engine limits
    applied (`kv_source`: where its GPU KV capacity comes from), the split (None:
    collocated), the program-level policy planes, the KV fetch mode and decode binder
    after their router-dependent defaults, and the workload source."""

    config: SimConfig
    profile: HardwareProfile
    kv_source: str
    split: tuple[int, int] | None
    retention: LoadedPolicy | None
    scheduling: LoadedPolicy
    dispatch: LoadedPolicy | None
    kv_fetch: str
    decode_binder: str
    source: WorkloadSource

    @property
    def unified(self) -> bool:
        """One GPU KV pool per node, no host tier (`host_kv=False`)."""
        return not self.config.host_kv

    @property
    def track_kv(self) -> bool:
        """Completed calls' KV is followed per branch: with a retention policy, and in the
        unified pool (whose freed KV is the most recently used)."""
        return self.retention is not None or self.unified

    @property
    def fifo(self) -> bool:
        """The default FCFS keeps each node's queue in arrival order (the historical FIFO)
        and preempts as vLLM's FCFS does."""
        return type(self.scheduling.instance) is FCFS

    @property
    def collocated_only(self) -> bool:
        return self.split is None

    def initial_phases(self, node_ids: list[int]) -> dict[int, Phase]:
        """The first `split[0]` nodes prefill, the rest decode (collocated: all 'prefill')."""
        if self.split is None:
            return {n: "prefill" for n in node_ids}
        return {n: ("prefill" if i < self.split[0] else "decode") for i, n in enumerate(node_ids)}


def resolve(cfg: SimConfig) -> ResolvedConfig:
    """Check `cfg` completely and load what it names (see `ResolvedConfig`)."""
    cfg.validate()
    profile = cfg.profile if isinstance(cfg.profile, HardwareProfile) else load_profile(cfg.profile)
    # Engine limits (off by default) set the batch cap, the token budget and GPU KV.
    profile, kv_source = cfg.engine_profile(profile)
    split = cfg.split_counts

    def policy(family: Family) -> LoadedPolicy:
        params = getattr(cfg, f"{family}_params")
        return load_policy(family, cfg.policy_spec(family), params, hook_budget_s=cfg.hook_budget_s)

    # Program-level policy planes (paper 003 §3).
    retention = None if cfg.retention is None else policy("retention")
    scheduling = policy("scheduling")
    dispatch = None if cfg.dispatch is None else policy("dispatch")
    kv_fetch = cfg.kv_fetch or DEFAULT_FETCH.get(cfg.router, "none")
    if not cfg.host_kv:
        if cfg.kv_fetch not in (None, "none"):
            raise ConfigError(
                "host_kv=False has no shared host pool to fetch from; use --kv-fetch none"
            )
        kv_fetch = "none"
    source = make_workload(
        cfg.workload, seed=cfg.seed, duration_s=cfg.duration_s, **cfg.workload_params
    )
    if cfg.trace_cycle and source.trace_programs() is None:
        raise ConfigError(f"trace_cycle (--cycle) needs a trace workload, not {cfg.workload!r}")
    if cfg.trace_cycle and getattr(source.params, "cycle", True) is False:
        raise ConfigError("trace_cycle (--cycle) contradicts the trace parameter cycle=False")
    return ResolvedConfig(
        config=cfg,
        profile=profile,
        kv_source=kv_source,
        split=split,
        retention=retention,
        scheduling=scheduling,
        dispatch=dispatch,
        kv_fetch=kv_fetch,
        decode_binder=cfg.decode_binder or DEFAULT_BINDER.get(cfg.router, "round-robin"),
        source=source,
    )
