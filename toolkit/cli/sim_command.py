"""Typer options built from `SimConfig`'s fields (cluster/sim/fields.py), for `pdlab simulate`
and `pdlab serve`.

A command declares one parameter `sim: SimOptions`; `@sim_command()` replaces it by one
typer option per field that carries a flag (name, type, default and help from the field),
plus `--policy-param`, and hands the command the parsed values as one `SimOptions`. A new
simulation option is a `sim_field(...)` in SimConfig and nothing else: it appears on
`pdlab simulate`, in `SimOptions` and in the size checks at once.

    @sim_command(only=("workload", "nodes"), overrides={"nodes": {"default": None}})
    def serve_command(sim: SimOptions, port: int = typer.Option(8600, help="TCP port")): ...
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import typer

# Light imports only: every command's options are built for `pdlab --help`.
from cluster.sim.config import CLI_FIELDS as OPTIONS
from cluster.sim.fields import CliField

if TYPE_CHECKING:
    pass

F = TypeVar("F", bound=Callable[..., Any])
POLICY_PARAM = "policy_param"
_POLICY_HELP = "FAMILY.KEY=VALUE for a policy, e.g. retention.tau_s=5"


def _option(spec: CliField, over: Mapping[str, Any]) -> inspect.Parameter:
    """The typer option of one field: `--flag` (a boolean `--flag/--no-flag` or `--flag`)."""
    default = over.get("default", spec.default)
    assert spec.flag is not None
    decl = f"--{spec.flag}/--no-{spec.flag}" if spec.switch == "on/off" else f"--{spec.flag}"
    annotation: Any = spec.type if default is not None else spec.type | None
    info = typer.Option(default, decl, help=over.get("help", spec.help))
    return inspect.Parameter(
        spec.param, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=info, annotation=annotation
    )


def sim_options(
    only: Iterable[str] | None = None, overrides: Mapping[str, Mapping[str, Any]] | None = None
) -> list[inspect.Parameter]:
    """The typer parameters of the simulation options, in SimConfig's field order: every
    field with a flag that `pdlab simulate` offers, or the options named in `only`;
    `overrides` maps an option to a different `default` or `help`."""
    over = dict(overrides or {})
    names = None if only is None else set(only)
    known = {o.param for o in OPTIONS} | {POLICY_PARAM}
    if (names is not None and names - known) or set(over) - known:
        raise TypeError(f"not simulation options: {sorted((names or set()) | set(over) - known)}")
    params = [
        _option(o, over.get(o.param, {}))
        for o in OPTIONS
        if (o.simulate if names is None else o.param in names)
    ]
    if names is None or POLICY_PARAM in names:
        info = typer.Option([], "--policy-param", help=_POLICY_HELP)
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        params.append(inspect.Parameter(POLICY_PARAM, kind, default=info, annotation=list[str]))
    return params


def sim_command(
    only: Iterable[str] | None = None, overrides: Mapping[str, Mapping[str, Any]] | None = None
) -> Callable[[F], F]:
    """Decorate a typer command: its `sim: SimOptions` parameter becomes the options of
    `sim_options(only, overrides)`, in its place, and the command receives them as one
    `SimOptions` (see the module docstring)."""

    def decorate(func: F) -> F:
        sig = inspect.signature(func)  # `sim`'s annotation is not evaluated (a lazy import)
        generated = sim_options(only, overrides)
        names = [p.name for p in generated]
        params: list[inspect.Parameter] = []
        for p in sig.parameters.values():
            if p.name == "sim":
                params.extend(generated)
            elif isinstance(p.annotation, str):  # postponed (PEP 563): as typer evaluates it
                params.append(p.replace(annotation=eval(p.annotation, func.__globals__)))
            else:
                params.append(p)
        if len(params) != len(sig.parameters) - 1 + len(generated):
            raise TypeError(f"{func.__name__} needs a parameter `sim: SimOptions`")

        @functools.wraps(func)
        def command(**kwargs: Any) -> Any:
            from toolkit.cli.sim_options import SimOptions

            given = {name: kwargs.pop(name) for name in names}
            policy = tuple(given.pop(POLICY_PARAM, ()) or ())
            return func(sim=SimOptions(policy_param=policy, **given), **kwargs)

        command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command  # type: ignore[return-value]

    return decorate
