"""Command-line options to a `SimConfig`, in one place for `pdlab simulate`, `sweep` and `serve`.

`SimOptions` holds the options as the CLI names them (`--duration`, `--warmup`,
`--arrival-rate`, ...), `None` meaning "not given". `to_config()` applies the defaults
that depend on other options, once:

- `agents`: 126 unless `arrival_rate` is given (closed loop by default, open loop with a
  rate; never both);
- `warmup`: `cluster.sweep.default_warmup_s` = min(600 s, duration / 6), so the 3,600 s
  default run keeps its 600 s warmup and a 60 s run gets 10 s instead of an error; a trace
  replayed at its arrival times uses its last arrival instead of the duration when that is
  earlier (the run ends when the trace's last request finishes);
- `cycle`: `trace_cycle`, the loop of `agents` (or `arrival_rate`) cycling a trace's
  programs instead of replaying its arrival times once;
- `retention`, `scheduling`, `dispatch` and `policy_param` (FAMILY.KEY=VALUE) become the
  policy-plane fields (`policy_options`);

and then checks the configuration completely (`check_config`: profile, workload, policies,
split), so a command can report a bad option before it starts a progress bar or a worker.
Also the small parsers the sweep options share (`parse_value`, `key_values`) and
`clean_json`, which turns the non-finite floats of a summary into JSON nulls.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable
from typing import Any

from cluster.core import ConfigError
from cluster.sim.simulator import SimConfig, Simulator
from cluster.sweep import default_warmup_s, replay_end_s

FAMILIES = ("retention", "scheduling", "dispatch")
DEFAULT_AGENTS = 126
# CLI option name -> SimConfig field, where they differ.
_FIELD_OF = {
    "arrival_rate": "arrival_rate_per_min",
    "duration": "duration_s",
    "warmup": "warmup_s",
    "learn": "learn_s",
    "relaunch": "relaunch_s",
    "window": "window_s",
    "cooldown": "cooldown_s",
    "cycle": "trace_cycle",
    "hook_budget": "hook_budget_s",
    "form": "fit_form",
}
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(SimConfig)}


def parse_value(text: str) -> Any:
    """JSON where the text parses as JSON (numbers, true/false, null), the string otherwise."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def key_values(items: Iterable[str], what: str) -> list[tuple[str, str]]:
    """KEY=VALUE options split at the first '='; `what` names the option in errors."""
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{what} {item!r} must look like KEY=VALUE")
        out.append((key.strip(), value))
    return out


def policy_options(
    retention: str | None, scheduling: str | None, dispatch: str | None, params: Iterable[str]
) -> dict[str, Any]:
    """SimConfig fields of the policy planes from CLI options (FAMILY.KEY=VALUE parameters)."""
    out: dict[str, Any] = {
        "retention": retention,
        "scheduling": scheduling if scheduling is not None else _DEFAULTS["scheduling"],
        "dispatch": dispatch,
    }
    for key, value in key_values(params, "--policy-param"):
        family, _, name = key.partition(".")
        if family not in FAMILIES or not name:
            raise ConfigError(
                f"--policy-param {key!r} must be FAMILY.KEY=VALUE with FAMILY one of "
                f"{', '.join(FAMILIES)}"
            )
        out.setdefault(f"{family}_params", {})[name] = parse_value(value)
    return out


def check_config(cfg: SimConfig) -> None:
    """Raise ConfigError for anything the simulator would refuse, without running it.

    Builds the simulator once (milliseconds, also for hundreds of nodes): the same checks
    as the run itself, so nothing can pass here and fail later at start-up."""
    try:
        Simulator(cfg)
    except (ValueError, TypeError) as err:  # ConfigError is a ValueError
        if isinstance(err, ConfigError):
            raise
        raise ConfigError(str(err)) from None


@dataclasses.dataclass(frozen=True, slots=True)
class SimOptions:
    """The simulation options of `pdlab simulate` / `serve`, named as on the command line.

    None: not given; `to_config` applies SimConfig's default or the rule of the module
    docstring. `policy_param` holds FAMILY.KEY=VALUE strings."""

    workload: str | None = None
    nodes: int | None = None
    split: str | None = None
    agents: int | None = None
    arrival_rate: float | None = None
    max_active: int | None = None
    duration: float | None = None
    warmup: float | None = None
    learn: float | None = None
    planner: str | None = None
    router: str | None = None
    eviction: str | None = None
    profile: str | None = None
    seed: int | None = None
    kv_fetch: str | None = None
    telemetry: str | None = None
    relaunch: float | None = None
    window: float | None = None
    slices: int | None = None
    cooldown: float | None = None
    host_kv: bool | None = None
    l1_tokens: int | None = None
    l2_tokens: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    gpu_memory_gib: float | None = None
    gpu_memory_utilization: float | None = None
    prefill_forms: bool | None = None  # the router prices prefill with each node's fitted form
    max_programs: int | None = None
    cycle: bool | None = None
    retention: str | None = None
    scheduling: str | None = None
    dispatch: str | None = None
    policy_param: tuple[str, ...] = ()
    hook_budget: float | None = None  # seconds one policy hook call may take; 0: no limit
    form: str | None = None  # the warmup's fitted forms (SimConfig.fit_form)

    def fields(self) -> dict[str, Any]:
        """The SimConfig fields these options give (defaults resolved, nothing checked)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name in ("agents", "arrival_rate", "warmup", "policy_param", *FAMILIES):
                continue
            value = getattr(self, f.name)
            if f.name == "hook_budget" and value == 0:
                value, out["hook_budget_s"] = None, None  # no limit
            if value is not None:
                out[_FIELD_OF.get(f.name, f.name)] = value
        if self.arrival_rate is not None:
            out["arrival_rate_per_min"] = self.arrival_rate
            out["agents"] = self.agents  # None unless both are given (SimConfig refuses)
        else:
            out["agents"] = DEFAULT_AGENTS if self.agents is None else self.agents
        duration = out.get("duration_s", _DEFAULTS["duration_s"])
        if self.warmup is not None:
            out["warmup_s"] = self.warmup
        elif isinstance(duration, int | float) and duration > 0:
            out["warmup_s"] = default_warmup_s(float(duration), replay_end_s(out))
        out.update(
            policy_options(self.retention, self.scheduling, self.dispatch, self.policy_param)
        )
        return out

    def to_config(self, *, check: bool = True) -> SimConfig:
        """The SimConfig; with `check` (default) fully checked (`check_config`)."""
        cfg = SimConfig(**self.fields())
        if check:
            check_config(cfg)
        return cfg


def clean_json(v: Any) -> Any:
    """`v` with non-finite floats as None (JSON null), through dicts, lists and tuples."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: clean_json(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [clean_json(x) for x in v]
    return v
