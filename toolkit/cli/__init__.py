"""The `pdlab` command line (SPEC §7): one thin module per command (parse, call, print).

`toolkit.cli:app` is the typer app (built in `toolkit/cli/main.py`, loaded on first use).
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """`toolkit.cli:app` (the `pdlab` console script) without importing every command module
    whenever one of them is imported (PEP 562)."""
    if name == "app":
        from toolkit.cli.main import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
