"""What the browser tests share: JupyterLab finds the widget and plotly extensions.

JupyterLab looks for prebuilt extensions under `<sys.prefix>/share/jupyter`. A venv that
borrows its packages from another one (a worktree's venv over the main venv, by a .pth
file) has the packages but not that folder, and JupyterLab then draws widgets as text.
The folder next to the site-packages that hold `jupyterlab_widgets` is added to
JUPYTER_PATH when it is not the venv's own; in a normal venv nothing changes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest


def _extensions_dir() -> Path | None:
    try:
        import jupyterlab_widgets
    except ImportError:
        return None
    # <prefix>/lib/pythonX.Y/site-packages/jupyterlab_widgets/__init__.py -> <prefix>
    prefix = Path(jupyterlab_widgets.__file__).resolve().parents[4]
    data = prefix / "share" / "jupyter"
    own = Path(sys.prefix).resolve() / "share" / "jupyter"
    if data == own or not (data / "labextensions").is_dir():
        return None
    return data


@pytest.fixture(autouse=True)
def jupyter_path(monkeypatch: pytest.MonkeyPatch) -> None:
    data = _extensions_dir()
    if data is not None:
        paths = [p for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep) if p]
        if str(data) not in paths:
            monkeypatch.setenv("JUPYTER_PATH", os.pathsep.join([*paths, str(data)]))
