"""Simulation configuration: `SimConfig` and policy references (SPEC §5, §7); `parse_split`
(cluster.core) stays importable from here."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from cluster import size_limits as limits
from cluster.core import ConfigError, parse_split
from cluster.sim.fields import cli_fields, sim_field
from cluster.size_limits import DEFAULT_HOOK_BUDGET_S

# Only what the fields need is imported here: `pdlab --help` builds its simulation options
# from this module (toolkit/cli/sim_command.py), so the engine, profile and policy modules load
# when a config is checked or resolved, not with the CLI.
if TYPE_CHECKING:
    from cluster.hardware.profiles import HardwareProfile
    from cluster.sim.resolved import ResolvedConfig
    from models.overheads import ServingOverheads

# What `fit_form` may name (models.forms; the mixed forms do not apply to the simulator).
SIM_FORMS = ("paper", "auto", "floor", "roofline", "ctx")

# Alg. E.3's T_learn when not given: paper 000's node models converge within a minute of
# learning (Fig. 8a), so a few minutes suffice and the split adapts before scoring starts.
DEFAULT_LEARN_S = 300.0


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


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One simulation run. Each field's option name, help text, command-line default and
    size ceiling sit beside it (`sim_field`, cluster/sim/fields.py): `pdlab simulate` and
    `pdlab serve` build their options from them (toolkit/cli/sim_command.py)."""

    workload: str = sim_field(
        "cc", type=str, help="putnam | cc | osworld | shift | path to a trace file"
    )
    workload_params: dict[str, Any] = field(default_factory=dict)
    nodes: int = sim_field(
        9, type=int, help="Number of nodes (each 4 GPUs in the presets)", limit=limits.NODES
    )
    split: str = sim_field("4P5D", type=str, help="Initial split XPYD, or 'collocated'")
    agents: int | None = sim_field(
        126,
        type=int,
        cli_default=None,  # 126 unless --arrival-rate (toolkit.cli.sim_options)
        help="Closed loop: concurrent agents (default 126 unless --arrival-rate; a trace with "
        "arrival times replays them instead, unless --cycle)",
    )
    arrival_rate_per_min: float | None = sim_field(
        None,
        flag="arrival-rate",
        type=float,
        help="Open loop: Poisson agent arrivals per minute",
        limit=limits.ARRIVAL_RATE_PER_MIN,
    )
    max_active: int = sim_field(
        258,
        type=int,
        help="Open loop admission limit (concurrent agents)",
        limit=limits.MAX_ACTIVE,
    )
    duration_s: float = sim_field(
        3600.0, flag="duration", type=float, help="Simulated seconds", limit=limits.SIM_SECONDS
    )
    warmup_s: float = sim_field(
        600.0,
        flag="warmup",
        type=float,
        cli_default=None,  # cluster.sweep.default_warmup_s (toolkit.cli.sim_options)
        help="Warmup seconds excluded from metrics (default: a sixth of --duration, at most "
        "600; the gain planner serves collocated and fits during the first --learn of them)",
        limit=limits.SIM_SECONDS,
    )
    # Alg. E.3's T_learn: collocated serving and the model fit before disaggregation starts
    # (gain planner; other planners fit then). None: min(DEFAULT_LEARN_S, warmup), so the
    # planner's first windows and decisions fall inside the warmup, as in paper 000's runs.
    learn_s: float | None = sim_field(
        None,
        flag="learn",
        type=float,
        help="Seconds of collocated learning and model fitting before disaggregation, within "
        "the warmup (Alg. E.3 T_learn; default: min(300, --warmup))",
        limit=limits.SIM_SECONDS,
    )
    planner: str = sim_field("gain", type=str, help="gain | static | dynamo | arrow")
    router: str = sim_field(
        "ttft", type=str, help="ttft | cache-aware | dynamo | sticky | round-robin | least-loaded"
    )
    eviction: str = sim_field("branch", type=str, help="branch | lru")
    profile: str | HardwareProfile = sim_field(  # noqa: RUF009 (a field specifier)
        "gb300", type=str, help="Preset (gb300, h200) or path to a `pdlab fit --json` file"
    )
    seed: int = sim_field(0, type=int, help="Random seed")
    kv_fetch: str | None = sim_field(  # default: async for ttft, none for the baselines
        None, type=str, help="async | sync | none (default: async for ttft, none otherwise)"
    )
    decode_binder: str | None = None
    copy_price_s_per_token: float = 2e-7
    relaunch_s: float = sim_field(
        700.0,
        flag="relaunch",
        type=float,
        help="Seconds a Dynamo-like relaunch keeps a node out of service",
        limit=limits.SIM_SECONDS,
    )
    window_s: float = sim_field(
        600.0,
        flag="window",
        type=float,
        help="Planner window T_win (simulated seconds)",
        limit=limits.SIM_SECONDS,
        simulate=False,
    )
    slices: int = sim_field(10, type=int, help="Planner slices m per window", simulate=False)
    cooldown_s: float = sim_field(
        120.0,
        flag="cooldown",
        type=float,
        help="Planner cooldown after a switch (simulated seconds)",
        limit=limits.SIM_SECONDS,
        simulate=False,
    )
    planner_tick_s: float = sim_field(10.0, flag=None, limit=limits.SIM_SECONDS)
    telemetry: str = sim_field(  # full | compact (drops kv_events, branch_counts, router_decisions)
        "full",
        type=str,
        help="full | compact (compact drops kv_events, branch_counts, router_decisions)",
    )
    l1_tokens: int | None = sim_field(
        None, type=int, help="GPU KV tokens per node (profile default)", limit=limits.KV_TOKENS
    )
    l2_tokens: int | None = sim_field(
        None, type=int, help="Host KV tokens per node (profile default)", limit=limits.KV_TOKENS
    )
    # closed-loop agents start spread over this many seconds
    stagger_s: float = sim_field(60.0, flag=None, limit=limits.SIM_SECONDS)
    # Program-level policy planes (paper 003 §3); specs are registry names, file paths
    # (path/to/policy.py[:Class]), modules (pkg.mod:Class) or, in code, classes/instances.
    retention: Any = sim_field(  # noqa: RUF009 (a field specifier); None: the tiers keep `eviction` (no retention decisions)
        None,
        type=str,
        help="Retention policy (paper 003): evict-always | lru | ttl | per-tool-ttl | "
        "pressure-ttl | min-waste | branch-count | path.py[:Class] | pkg.module:Class",
    )
    retention_params: dict[str, Any] = field(default_factory=dict)
    scheduling: Any = sim_field(  # noqa: RUF009 (a field specifier)
        "fcfs",
        type=str,
        help="Scheduling priority: fcfs | program-fcfs | plas | path.py[:Class]",
    )
    scheduling_params: dict[str, Any] = field(default_factory=dict)
    dispatch: Any = sim_field(  # noqa: RUF009 (a field specifier); None: the PD router `router` places calls
        None,
        type=str,
        help="Program routing instead of --router: round-robin | least-loaded | "
        "session-affinity | path.py[:Class]",
    )
    dispatch_params: dict[str, Any] = field(default_factory=dict)
    host_kv: bool = sim_field(  # False: one GPU KV pool per node, no host tier
        True,
        type=bool,
        switch="on/off",
        help="--no-host-kv: one GPU KV pool per node, no host tier",
    )
    max_programs: int | None = sim_field(  # stop admitting new programs after this many
        None, type=int, help="Admit at most this many programs", limit=limits.MAX_PROGRAMS
    )
    # A trace with arrival times replays each program once at its time (agents and
    # arrival_rate_per_min do not apply) and the run ends when its last program finishes.
    # True: the closed (agents) or open (arrival rate) loop cycles the trace's programs,
    # ignoring their times. A trace without times feeds the closed loop once unless True.
    trace_cycle: bool = sim_field(
        False,
        flag="cycle",
        type=bool,
        switch="flag",
        help="Trace: --agents agents (or --arrival-rate) cycle the trace's programs, ignoring "
        "arrival times (default: each program once, at its arrival time if it has one; the "
        "run ends when the last finishes)",
    )
    # Wall seconds one policy hook call may run before the run fails (None: no limit);
    # passed to `load_policy(..., hook_budget_s=...)` (cluster.policies.guard).
    hook_budget_s: float | None = sim_field(
        DEFAULT_HOOK_BUDGET_S,
        flag="hook-budget",
        type=float,
        cli_default=None,  # 0 on the command line: no limit (toolkit.cli.sim_options)
        help="Wall seconds one user policy hook call may run before the run fails naming it "
        "(default 10; 0: no limit)",
        limit=limits.HOOK_BUDGET_S,
    )
    # Engine limits of every node (vLLM's names), all off by default (`engine_limits`):
    # running decodes per node (and sequences per prefill iteration), the per-iteration
    # token budget (prefill chunks; a collocated node's running decodes take theirs first),
    # and KV capacity from GPU memory (instead of l1_tokens; needs a profile with a model).
    # With any of them set, decode KV grows as tokens are generated and a node that runs
    # out preempts its newest running decode (recompute), as vLLM does.
    max_num_seqs: int | None = sim_field(
        None,
        type=int,
        help="Engine limit: running sequences per node (decode batch cap, the rest queue; "
        "sequences per prefill iteration). Any engine limit makes decode KV grow as "
        "generated and preempts the newest decode when it runs out (vLLM)",
        limit=limits.MAX_NUM_SEQS,
    )
    max_num_batched_tokens: int | None = sim_field(
        None,
        type=int,
        help="Engine limit: token budget per iteration (prefill chunks; a collocated "
        "node's running decodes take theirs first) (default: the profile's chunk)",
        limit=limits.BATCHED_TOKENS,
    )
    gpu_memory_gib: float | None = sim_field(
        None,
        type=float,
        help="Engine limit: GPU memory per GPU; KV capacity per node = memory x "
        "utilization - weights - activations, from the profile's model (instead of "
        "--l1-tokens; needs a `pdlab profile import` profile)",
        limit=limits.GPU_MEMORY_GIB,
    )
    gpu_memory_utilization: float | None = sim_field(
        None,
        type=float,
        help="Share of --gpu-memory-gib the engine may use, in (0, 1] (default 0.9)",
    )
    # The router prices prefill with each node's fitted form (the profile's extra terms:
    # ControlPlaneConfig.prefill_forms) instead of Eq. 3 alone.
    prefill_forms: bool = sim_field(
        False,
        type=bool,
        switch="flag",
        help="The router prices each node's prefill with the profile's fitted form (its "
        "prefill floor and roofline terms: a `pdlab profile import` profile or a fit JSON) "
        "instead of Eq. 3 alone (a --form other than paper does too, with the forms the "
        "warmup chose)",
    )
    # The iteration-time forms fitted at the end of warmup (models.forms): "paper" (Eq. 1/2),
    # "auto" (chosen per node by cross-validation) or one form's name.
    fit_form: str = sim_field(
        "paper",
        flag="form",
        type=str,
        help="Iteration-time forms the warmup fits and the planner and router price with: "
        "paper (Eq. 1/2), auto (chosen per node by cross-validation, as `pdlab fit --form "
        "auto`), floor, roofline, ctx",
    )
    # Serving overheads of a live PD cluster (models.overheads, fitted from a live run's
    # stages): delays where a live request spends them (proxy ingress, engine wake-up, KV
    # hand-off, decode join, streaming out) and each pass's CPU overhead. None: none, the
    # simulator as before (its draws come from a generator of their own: seed + 1).
    overheads: ServingOverheads | None = None

    def __post_init__(self) -> None:
        for family in ("retention", "scheduling", "dispatch"):
            spec = getattr(self, family)
            if spec is not None and not isinstance(spec, str):
                object.__setattr__(self, family, PolicyRef(family, spec))

    @property
    def learn_period_s(self) -> float:
        """T_learn in simulated seconds: `learn_s`, else min(DEFAULT_LEARN_S, warmup)."""
        return min(DEFAULT_LEARN_S, self.warmup_s) if self.learn_s is None else self.learn_s

    @property
    def engine_limits(self) -> bool:
        """Some engine limit is set (module fields above): vLLM-like nodes."""
        return (
            self.max_num_seqs is not None
            or self.max_num_batched_tokens is not None
            or self.gpu_memory_gib is not None
        )

    def resolve(self) -> ResolvedConfig:
        """This config checked completely, with its defaults applied and its profile,
        policies and workload loaded (cluster/sim/resolved.py): what `Simulator` is built
        from. Raises ConfigError naming what is wrong and what is allowed."""
        from cluster.sim.resolved import resolve

        return resolve(self)

    @property
    def split_counts(self) -> tuple[int, int] | None:
        """(prefill, decode) nodes of `split`; None: collocated (`parse_split`)."""
        return parse_split(self.split, self.nodes)

    def policy_spec(self, family: str) -> Any:
        """The policy `family` names ('retention', 'scheduling', 'dispatch') as
        `load_policy` takes it: a class or instance given in code, else its spec."""
        return _spec(getattr(self, family))

    def engine_profile(self, profile: HardwareProfile) -> tuple[HardwareProfile, str]:
        """`profile` with this config's engine limits applied (`engine_profile`)."""
        return engine_profile(self, profile)

    def validate(self) -> None:
        self._validate_engine_limits()
        if self.nodes < 1 or (self.nodes < 2 and self.split != "collocated"):
            raise ConfigError(
                f"--nodes must be >= 2 (>= 1 with --split collocated), got {self.nodes}"
            )
        parse_split(self.split, self.nodes)
        if self.fit_form not in SIM_FORMS:
            raise ConfigError(
                f"--form must be one of {', '.join(SIM_FORMS)} (models.forms), got {self.fit_form!r}"
            )
        if self.max_programs is not None and self.max_programs < 1:
            raise ConfigError(f"max_programs must be >= 1, got {self.max_programs}")
        if self.hook_budget_s is not None and not self.hook_budget_s > 0:
            raise ConfigError(
                f"hook_budget_s must be > 0 seconds or None, got {self.hook_budget_s}"
            )
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
        from cluster.kv.eviction import EVICTION_POLICIES

        if self.eviction not in EVICTION_POLICIES:
            raise ConfigError(
                f"unknown eviction {self.eviction!r}; choose one of: {', '.join(EVICTION_POLICIES.names())}"
            )
        self._validate_sizes()  # ceilings last: the checks above say more at the low end

    def _validate_sizes(self) -> None:
        """Every count and size against its ceiling (cluster.size_limits), before anything
        is allocated: a typo must not build a hundred million agents."""
        for spec, limit in _LIMITED:
            limits.check(spec.label, getattr(self, spec.field), limit)
        limits.check_agents("--agents", self.agents, self.nodes)

    def _validate_engine_limits(self) -> None:
        for flag, v in (
            ("--max-num-seqs", self.max_num_seqs),
            ("--max-num-batched-tokens", self.max_num_batched_tokens),
        ):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ConfigError(f"{flag} must be an integer >= 1, got {v!r}")
        gib, util = self.gpu_memory_gib, self.gpu_memory_utilization
        if gib is not None and not gib > 0:
            raise ConfigError(f"--gpu-memory-gib must be > 0, got {gib}")
        if util is not None and not 0.0 < util <= 1.0:
            raise ConfigError(f"--gpu-memory-utilization must be in (0, 1], got {util}")
        if util is not None and gib is None:
            raise ConfigError("--gpu-memory-utilization needs --gpu-memory-gib")
        if gib is not None and self.l1_tokens is not None:
            raise ConfigError(
                "give one of --gpu-memory-gib (KV capacity from GPU memory) or --l1-tokens"
            )
        if gib is not None and not self.host_kv:
            raise ConfigError(
                "--gpu-memory-gib sizes the tiered nodes' GPU KV; with --no-host-kv give "
                "--l1-tokens"
            )


# The fields with a command-line flag (`pdlab simulate`, `serve`, `SimOptions`), and those
# with a ceiling (the first one broken, in field order, is reported).
CLI_FIELDS = tuple(spec for spec in cli_fields(SimConfig) if spec.flag is not None)
_LIMITED = tuple((spec, spec.limit) for spec in cli_fields(SimConfig) if spec.limit is not None)


def engine_profile(cfg: SimConfig, profile: HardwareProfile) -> tuple[HardwareProfile, str]:
    """The profile with the config's engine limits applied, and where its GPU KV capacity
    comes from: `max_num_seqs` caps the decode batch, `max_num_batched_tokens` is the
    prefill chunk budget, and `gpu_memory_gib` sizes the GPU KV per node as
    `cluster.hardware.engine_settings.EngineSettings.kv_capacity` does (weights and KV bytes per
    token from the profile's model; host KV then 4x GPU unless `l2_tokens` is given).
    Without limits the profile is returned unchanged."""
    from cluster.hardware.engine_settings import GIB, EngineSettings

    if not cfg.engine_limits:
        return profile, "profile"
    changes: dict[str, Any] = {}
    if cfg.max_num_seqs is not None:
        changes["max_decode_batch"] = cfg.max_num_seqs
    if cfg.max_num_batched_tokens is not None:
        changes["chunk_tokens"] = cfg.max_num_batched_tokens
    source = "l1_tokens" if cfg.l1_tokens is not None else "profile"
    if cfg.gpu_memory_gib is not None:
        shape = profile.model_shape
        if shape is None:
            raise ConfigError(
                f"--gpu-memory-gib needs a profile with a model (weights and KV bytes per "
                f"token): import one with `pdlab profile import`; profile {profile.name} has "
                f"none (or give --l1-tokens)"
            )
        engine = (profile.engine or EngineSettings()).with_overrides(
            gpu_memory_bytes=int(cfg.gpu_memory_gib * GIB),
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens or profile.chunk_tokens,
        )
        kv = engine.kv_capacity(shape, reserve_bytes=engine.non_kv_reserve_bytes(shape))
        changes["l1_tokens"] = kv.tokens
        changes["l2_tokens"] = cfg.l2_tokens or 4 * kv.tokens
        source = "GPU memory"
    return replace(profile, **changes), source


def _spec(spec: Any) -> Any:
    return spec.obj if isinstance(spec, PolicyRef) else spec
