"""Command-line options to a `SimConfig`, in one place for `pdlab simulate`, `sweep` and `serve`.

`SimOptions` holds the options as the CLI names them (`--duration`, `--warmup`,
`--arrival-rate`, ...: the flags SimConfig's fields declare, cluster/sim/fields.py),
`None` meaning "not given". `to_config()` applies the defaults that depend on other
options, once:

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
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from cluster.core import ConfigError
from cluster.sim.config import CLI_FIELDS
from cluster.sim.simulator import SimConfig, Simulator
from cluster.sweep import default_warmup_s, replay_end_s

FAMILIES = ("retention", "scheduling", "dispatch")
DEFAULT_AGENTS = 126
# SimConfig's fields with a command-line flag (cluster/sim/fields.py), by option name.
OPTIONS = CLI_FIELDS
_BY_PARAM = {o.param: o for o in OPTIONS}
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


class SimOptions:
    """The simulation options of `pdlab simulate` / `serve`, named as on the command line:
    one keyword per `OPTIONS` entry (SimConfig's fields with a flag, cluster/sim/fields.py)
    and `policy_param` (FAMILY.KEY=VALUE strings).

    None or absent: not given; `to_config` applies SimConfig's default or the rule of the
    module docstring. Unknown names are a TypeError, as for a dataclass."""

    __slots__ = ("_given", "policy_param")

    def __init__(self, *, policy_param: Iterable[str] = (), **given: Any) -> None:
        unknown = sorted(set(given) - set(_BY_PARAM))
        if unknown:
            raise TypeError(f"SimOptions got unknown options: {', '.join(unknown)}")
        self._given: Mapping[str, Any] = MappingProxyType(dict(given))
        self.policy_param = tuple(policy_param)

    def get(self, name: str) -> Any:
        """The option `name` as given (None: not given)."""
        if name not in _BY_PARAM:
            raise KeyError(name)
        return self._given.get(name)

    def replace(self, **changes: Any) -> SimOptions:
        return SimOptions(policy_param=self.policy_param, **{**self._given, **changes})

    def __repr__(self) -> str:
        given = ", ".join(f"{k}={v!r}" for k, v in self._given.items() if v is not None)
        return f"SimOptions({given})"

    def fields(self) -> dict[str, Any]:
        """The SimConfig fields these options give (defaults resolved, nothing checked)."""
        out: dict[str, Any] = {}
        given = self.get
        for o in OPTIONS:
            if o.param in ("agents", "arrival_rate", "warmup", *FAMILIES):
                continue
            value = given(o.param)
            if o.param == "hook_budget" and value == 0:
                value, out["hook_budget_s"] = None, None  # no limit
            if value is not None:
                out[o.field] = value
        if given("arrival_rate") is not None:
            out["arrival_rate_per_min"] = given("arrival_rate")
            out["agents"] = given("agents")  # None unless both are given (SimConfig refuses)
        else:
            out["agents"] = DEFAULT_AGENTS if given("agents") is None else given("agents")
        duration = out.get("duration_s", _DEFAULTS["duration_s"])
        if given("warmup") is not None:
            out["warmup_s"] = given("warmup")
        elif isinstance(duration, int | float) and duration > 0:
            out["warmup_s"] = default_warmup_s(float(duration), replay_end_s(out))
        out.update(
            policy_options(
                given("retention"), given("scheduling"), given("dispatch"), self.policy_param
            )
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
