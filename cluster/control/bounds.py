"""What the control plane's live settings may be set to (paper 000 Alg. E.3, Eq. 7; SPEC §4, §6).

A setting changed on a running cluster (the gain planner's window T_win and slices m, the
router's copy price kappa) is checked here, by the control plane's setters and by the control
server before them, so a value that would stall or break the run is refused with a message
naming the allowed range. Why these ranges: an evaluation of the gain test costs O(m x
candidates) under the control-plane lock and runs every T_win, so m is at most 100 and each
slice spans at least 1 s; T_win runs from 10 s to a day; kappa prices a token copied from
another node's host memory (~1e-7 s on current hardware), and above 0.01 s/token the
predicted TTFT of Eq. 7 would dwarf any real queue.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from cluster.core import ConfigError


class Range(NamedTuple):
    """A closed interval [lo, hi] of a setting, with its unit for messages."""

    lo: float
    hi: float
    unit: str = ""

    def describe(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        return f"[{_num(self.lo)}, {_num(self.hi)}]{unit}"

    def check(self, name: str, value: float) -> None:
        """Raise ConfigError unless `value` is a finite number within the range."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{name} must be a number in {self.describe()}, got {value!r:.80}")
        if not (math.isfinite(value) and self.lo <= value <= self.hi):
            raise ConfigError(f"{name} must be in {self.describe()}, got {value:g}")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


WINDOW_S = Range(10.0, 86_400.0, "simulated s")  # T_win
SLICES = Range(2, 100, "slices")  # m (the gain test needs m >= 2)
MIN_SLICE_S = 1.0  # T_win / m
COPY_PRICE_S_PER_TOKEN = Range(0.0, 0.01, "s/token")  # kappa


def check_window(window_s: float, slices: int) -> None:
    """The gain planner's window and slices (ConfigError naming what is allowed)."""
    WINDOW_S.check("window_s", window_s)
    if isinstance(slices, bool) or not isinstance(slices, int):
        raise ConfigError(f"slices must be an integer in {SLICES.describe()}, got {slices!r:.80}")
    SLICES.check("slices", slices)
    if window_s / slices < MIN_SLICE_S:
        raise ConfigError(
            f"window_s / slices must be >= {MIN_SLICE_S:g} s (a slice needs time to hold "
            f"completed requests), got {window_s:g} s / {slices} slices"
        )


def check_copy_price(copy_price_s_per_token: float) -> None:
    COPY_PRICE_S_PER_TOKEN.check("copy_price", copy_price_s_per_token)
