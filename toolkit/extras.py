"""Optional dependencies and the one line that says how to get each (pyproject extras).

pdlab's core (simulate, fit, report, twin, advise, serve and lab on a simulated cluster,
attach) needs no torch; only the torch engine does (`pdlab engine`, `serve/lab --engines
torch`, the engine bench), and it comes with the `engine` extra (`torch>=2.4`). Commands that
need torch call `torch_missing()` before anything starts and print its line when it is not
None; nothing of the core imports torch (tests/toolkit/test_no_torch.py holds it to that).
"""

from __future__ import annotations

import importlib.util

ENGINE_EXTRA = "pip install 'pdlab[engine]'"


def torch_missing(what: str = "the torch engine") -> str | None:
    """None when torch can be imported; else one line naming `what` and the extra."""
    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a broken install, or torch blocked in sys.modules
        found = False
    if found:
        return None
    return f"{what} needs PyTorch, which is not installed: {ENGINE_EXTRA} (torch>=2.4)"
