"""How `pdlab … --help` is laid out: click's plain option list, up to 120 columns wide.

rich's option tables (typer's default) give the help text column its space first and cut
long option names at 80 columns (`--gpu-memory-utiliza…`); click's list puts a long name on
a line of its own and wraps the help under it, so every name is whole at any width. Help
texts are printed as written (no rich markup to mistake `path.py[:Class]` for a tag).
A group lists each command with its docstring's whole first paragraph, wrapped (click
would cut it at its first '. ', which 'Eq. 1' is).
"""

from __future__ import annotations

import inspect
from typing import Any

import click
from typer.core import TyperGroup


class HelpGroup(TyperGroup):
    """A command group whose command list shows each command's first paragraph whole."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is None or cmd.hidden:
                continue
            text = cmd.short_help or inspect.cleandoc(cmd.help or "").split("\n\n")[0]
            rows.append((name, " ".join(text.split())))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


# Every typer.Typer of the CLI takes these (rich_markup_mode is per app; the width is
# inherited by sub-commands' contexts).
HELP_STYLE: dict[str, Any] = {
    "cls": HelpGroup,
    "rich_markup_mode": None,
    "context_settings": {"max_content_width": 120},
}
