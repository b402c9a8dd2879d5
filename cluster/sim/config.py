"""Simulation configuration: `SimConfig`, split parsing, policy references (SPEC §5, §7)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cluster.core import ConfigError
from cluster.eviction import EVICTION_POLICIES
from cluster.sim.profiles import HardwareProfile


class PolicyRef(str):
    """A policy class or instance given in code (notebooks), carried through `SimConfig` as
    its display name so configs stay JSON-serializable; the loader uses `obj`."""

    obj: Any

    def __new__(cls, family: str, obj: Any) -> PolicyRef:
        label = getattr(obj, "__name__", None) or type(obj).__name__
        ref = super().__new__(cls, f"python:{label}")
        ref.obj = obj
        return ref

    def __deepcopy__(self, memo: dict[int, Any]) -> PolicyRef:
        return self

    def __copy__(self) -> PolicyRef:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (_policy_ref, (str(self), self.obj))


def _policy_ref(label: str, obj: Any) -> PolicyRef:
    return PolicyRef("", obj)


def parse_split(split: str, nodes: int) -> tuple[int, int] | None:
    """'4P5D' -> (4, 5); 'collocated' -> None. Errors name what is allowed."""
    if split == "collocated":
        return None
    s = split.upper()
    try:
        p_str, d_str = s.rstrip("D").split("P")
        p, d = int(p_str), int(d_str)
    except ValueError:
        raise ConfigError(f"split must look like 4P5D or be 'collocated', got {split!r}") from None
    if p < 1 or d < 1 or p + d != nodes:
        raise ConfigError(
            f"split {split} needs >= 1 prefill and >= 1 decode node summing to --nodes {nodes}"
        )
    return p, d


@dataclass(frozen=True, slots=True)
class SimConfig:
    workload: str = "cc"
    workload_params: dict[str, Any] = field(default_factory=dict)
    nodes: int = 9
    split: str = "4P5D"
    agents: int | None = 126
    arrival_rate_per_min: float | None = None
    max_active: int = 258
    duration_s: float = 3600.0
    warmup_s: float = 600.0
    # Alg. E.3's T_learn: collocated serving and the model fit before disaggregation starts
    # (gain planner; other planners fit then). None: the whole warmup. A shorter T_learn lets
    # the planner's first window and decision fall inside the warmup, as in paper 000's runs.
    learn_s: float | None = None
    planner: str = "gain"
    router: str = "ttft"
    eviction: str = "branch"
    profile: str | HardwareProfile = "gb300"
    seed: int = 0
    kv_fetch: str | None = None  # default: async for ttft, none for the baselines
    decode_binder: str | None = None
    copy_price_s_per_token: float = 2e-7
    relaunch_s: float = 700.0
    window_s: float = 600.0
    slices: int = 10
    cooldown_s: float = 120.0
    planner_tick_s: float = 10.0
    telemetry: str = "full"  # full | compact (drops kv_events, branch_counts, router_decisions)
    l1_tokens: int | None = None
    l2_tokens: int | None = None
    stagger_s: float = 60.0  # closed-loop agents start spread over this many seconds
    # Program-level policy planes (paper 003 §3); specs are registry names, file paths
    # (path/to/policy.py[:Class]), modules (pkg.mod:Class) or, in code, classes/instances.
    retention: Any = None  # None: the tiers keep `eviction` (no retention decisions)
    retention_params: dict[str, Any] = field(default_factory=dict)
    scheduling: Any = "fcfs"
    scheduling_params: dict[str, Any] = field(default_factory=dict)
    dispatch: Any = None  # None: the PD router `router` places calls
    dispatch_params: dict[str, Any] = field(default_factory=dict)
    host_kv: bool = True  # False: one GPU KV pool per node, no host tier (collocated only)
    max_programs: int | None = None  # stop admitting new programs after this many

    def __post_init__(self) -> None:
        for family in ("retention", "scheduling", "dispatch"):
            spec = getattr(self, family)
            if spec is not None and not isinstance(spec, str):
                object.__setattr__(self, family, PolicyRef(family, spec))

    def validate(self) -> None:
        if self.nodes < 1 or (self.nodes < 2 and self.split != "collocated"):
            raise ConfigError(
                f"--nodes must be >= 2 (>= 1 with --split collocated), got {self.nodes}"
            )
        parse_split(self.split, self.nodes)
        if not self.host_kv and self.split != "collocated":
            raise ConfigError(
                "host_kv=False (a single GPU KV pool, no host tier) needs --split collocated"
            )
        if self.max_programs is not None and self.max_programs < 1:
            raise ConfigError(f"max_programs must be >= 1, got {self.max_programs}")
        if self.scheduling is None:
            raise ConfigError("scheduling must name a policy (default 'fcfs')")
        if (self.agents is None) == (self.arrival_rate_per_min is None):
            raise ConfigError(
                "give exactly one of --agents N (closed loop) or --arrival-rate R (open loop)"
            )
        if self.agents is not None and self.agents < 1:
            raise ConfigError(f"--agents must be >= 1, got {self.agents}")
        if self.arrival_rate_per_min is not None and self.arrival_rate_per_min <= 0:
            raise ConfigError(f"--arrival-rate must be > 0, got {self.arrival_rate_per_min}")
        if self.duration_s <= 0 or self.warmup_s < 0 or self.warmup_s >= self.duration_s:
            raise ConfigError(
                f"need 0 <= --warmup < --duration, got {self.warmup_s} and {self.duration_s}"
            )
        if self.learn_s is not None and not 0 < self.learn_s <= self.warmup_s:
            raise ConfigError(
                f"need 0 < --learn <= --warmup (learning ends within the warmup), "
                f"got {self.learn_s} and {self.warmup_s}"
            )
        if self.telemetry not in ("full", "compact"):
            raise ConfigError(f"telemetry must be full or compact, got {self.telemetry!r}")
        if self.eviction not in EVICTION_POLICIES:
            raise ConfigError(
                f"unknown eviction {self.eviction!r}; choose one of: {', '.join(EVICTION_POLICIES.names())}"
            )


def _spec(spec: Any) -> Any:
    return spec.obj if isinstance(spec, PolicyRef) else spec
