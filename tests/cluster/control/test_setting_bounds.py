"""The control plane's setters bound what they accept, whoever calls them (cluster/control/bounds.py).

The REST server checks the same ranges first; these checks are the defence in depth for a
notebook or a policy calling the control plane directly, and for the planner's start-up
settings (`pdlab serve --slices`).
"""

from __future__ import annotations

import math

import pytest

from cluster.control.bounds import COPY_PRICE_S_PER_TOKEN, SLICES, WINDOW_S, Range
from cluster.control.control_plane import ControlPlane, ControlPlaneConfig
from cluster.control.planning import GainPlanner
from cluster.core import ConfigError
from models import DecodeModel, NodeModel, PrefillModel

NODE = NodeModel(PrefillModel(0.03, 8e-5, 4e-10, 3e-7), DecodeModel(0.012, 0.015, 2.8e-4))


def plane() -> ControlPlane:
    phases = {0: "prefill", 1: "decode"}
    return ControlPlane(phases, dict.fromkeys(phases, NODE), ControlPlaneConfig(window_s=600))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"slices": 10**12}, "slices must be in [2, 100] slices, got 1e+12"),
        ({"slices": 101}, "slices must be in [2, 100] slices"),
        ({"slices": 1}, "slices must be in [2, 100] slices"),
        ({"slices": 4.0}, "slices must be an integer in [2, 100] slices, got 4.0"),
        ({"slices": True}, "slices must be an integer"),
        ({"window_s": 1e12}, "window_s must be in [10, 86400] simulated s, got 1e+12"),
        ({"window_s": math.nan}, "window_s must be in [10, 86400] simulated s, got nan"),
        ({"window_s": math.inf}, "window_s must be in [10, 86400]"),
        ({"window_s": 5.0}, "window_s must be in [10, 86400]"),
        ({"window_s": "600"}, "window_s must be a number in [10, 86400] simulated s, got '600'"),
        ({"window_s": 50.0, "slices": 60}, "window_s / slices must be >= 1 s"),
        ({"slices": 100}, None),  # 600 s / 100 slices: fine
    ],
)
def test_planner_setter_bounds(change: dict[str, object], needle: str | None) -> None:
    cp = plane()
    before = cp.planner_settings()
    if needle is None:
        cp.set_planner(**change)  # type: ignore[arg-type]
        return
    with pytest.raises(ConfigError) as err:
        cp.set_planner(mode="off", **change)  # type: ignore[arg-type]
    assert needle in str(err.value)
    assert cp.planner_settings() == before  # nothing changed, the mode neither


def test_window_checks_use_the_other_current_value() -> None:
    cp = plane()
    cp.set_planner(slices=100)  # 600 s / 100
    with pytest.raises(ConfigError, match="got 60 s / 100 slices"):
        cp.set_planner(window_s=60.0)


@pytest.mark.parametrize("price", [1e308, math.inf, math.nan, -1e-12, 0.0100001])
def test_copy_price_setter_bounds(price: float) -> None:
    cp = plane()
    with pytest.raises(ConfigError, match=r"copy_price must be in \[0, 0.01\] s/token"):
        cp.set_router("round-robin", price)
    assert cp.router_settings().policy != "round-robin"  # all or nothing
    with pytest.raises(ConfigError, match="copy_price must be in"):
        ControlPlane({0: "prefill", 1: "decode"}, dict.fromkeys((0, 1), NODE),
                     ControlPlaneConfig(copy_price_s_per_token=price))  # fmt: skip


def test_bounds_at_the_edges_are_accepted() -> None:
    cp = plane()
    assert (
        cp.set_router(copy_price_s_per_token=COPY_PRICE_S_PER_TOKEN.hi).copy_price_s_per_token
        == 0.01
    )
    s = cp.set_planner(window_s=WINDOW_S.hi, slices=int(SLICES.hi))
    assert (s.window_s, s.slices) == (86_400.0, 100)
    s = cp.set_planner(window_s=WINDOW_S.lo, slices=int(SLICES.lo))
    assert (s.window_s, s.slices) == (10.0, 2)


def test_the_planners_start_up_window_is_bounded_too() -> None:
    with pytest.raises(ConfigError, match=r"slices must be in \[2, 100\]"):
        GainPlanner(window_s=600.0, slices=10**12)
    with pytest.raises(ConfigError, match=r"window_s must be in \[10, 86400\]"):
        ControlPlane({0: "prefill", 1: "decode"}, dict.fromkeys((0, 1), NODE),
                     ControlPlaneConfig(window_s=1e9))  # fmt: skip


def test_range_describes_itself() -> None:
    assert Range(0, 2**31 - 1).describe() == "[0, 2147483647]"
    assert COPY_PRICE_S_PER_TOKEN.describe() == "[0, 0.01] s/token"
