"""The command-line face of `SimConfig`'s fields (SPEC §5, §7): the option name, help text,
command-line default and size ceiling of each field, kept beside the field as dataclass
metadata (`sim_field`), so the config is the single source of all of them.

`cli_fields()` reads them back in field order. `toolkit.cli.sim_command` builds the typer options of
`pdlab simulate` and `pdlab serve` from it, `toolkit.cli.sim_options.SimOptions` takes the same
names, and `SimConfig._validate_sizes` checks each `limit`. Nothing here imports a CLI
library: the typer glue lives in toolkit.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from cluster.size_limits import Limit

_KEY = "pdlab.cli"


@dataclass(frozen=True, slots=True)
class CliField:
    """One SimConfig field as an option: `--{flag}` (None: not on the command line, its
    ceiling named by the field), `type` its command-line type, `default` the command-line
    default (None: "not given", resolved from other options by `SimOptions`), `switch` a
    boolean's form ("on/off": --x/--no-x; "flag": --x alone), `simulate` False for a field
    that only `pdlab serve` offers."""

    field: str
    flag: str | None
    help: str
    type: type
    default: Any
    limit: Limit | None = None
    switch: str | None = None
    simulate: bool = True

    @property
    def param(self) -> str:
        """The command's parameter name: the flag with underscores ('arrival_rate')."""
        return (self.flag or self.field).replace("-", "_")

    @property
    def label(self) -> str:
        """How errors name the field: its option, or the field itself."""
        return f"--{self.flag}" if self.flag else self.field


_FIELD_DEFAULT = object()  # the command-line default is the field's default


def sim_field(
    default: Any = dataclasses.MISSING,
    *,
    help: str = "",
    flag: str | None = "",
    type: type | None = None,
    cli_default: Any = _FIELD_DEFAULT,
    limit: Limit | None = None,
    switch: str | None = None,
    simulate: bool = True,
    default_factory: Any = dataclasses.MISSING,
) -> Any:
    """A SimConfig field with its command-line face. `flag`: '' (default) the field's name
    with dashes, None off the command line; `type` (needed for an option) its value type;
    `cli_default` when the command line's differs (None: "not given")."""
    meta = {
        _KEY: {
            "flag": flag,
            "help": help,
            "type": type,
            "cli_default": cli_default,
            "limit": limit,
            "switch": switch,
            "simulate": simulate,
        }
    }
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def cli_fields(config_cls: type) -> tuple[CliField, ...]:
    """The fields of `config_cls` declared with `sim_field`, in field order."""
    out = []
    for f in dataclasses.fields(config_cls):
        meta = f.metadata.get(_KEY)
        if meta is None:
            continue
        flag = f.name.replace("_", "-") if meta["flag"] == "" else meta["flag"]
        if flag is not None and meta["type"] is None:
            raise TypeError(f"SimConfig.{f.name}: an option needs a type")
        default = f.default if meta["cli_default"] is _FIELD_DEFAULT else meta["cli_default"]
        out.append(
            CliField(
                f.name,
                flag,
                meta["help"],
                meta["type"] or object,
                default,
                meta["limit"],
                meta["switch"],
                meta["simulate"],
            )
        )
    return tuple(out)
