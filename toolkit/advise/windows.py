"""`pdlab advise`: the best split per window of the run, oscillation, and the recommendation.

The run's arrival span is cut into windows (the planner's window, or as given); in each,
the split with the best metric over the requests that arrived in it (mean over seeds of
the static replays) wins. When the winners, with repeats collapsed, return to a split they
had left (A -> B -> A), a planner following them would oscillate: each move pays a
switch, and the gain each window promises does not last. The recommendation is the split
best over the whole run with the switch from the run's split included (the replay that
switches at the end of the first window, toolkit.advise.run), the run's own split counted
without one (a move between a PD split and collocated engines counts none: its relaunch
is not modelled, and the reason says so). When its 95% interval overlaps the next best's, the two are "not
distinguishable" and the recommendation says so; an interval with no upper end (a twin
whose error leaves it not known) makes every comparison not distinguishable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from toolkit.twin.metrics import Timings, metric_values

if TYPE_CHECKING:
    from toolkit.advise.run import SplitAdvice


class Window(NamedTuple):
    t0: float
    t1: float
    requests: int
    best: str | None  # None: no split finished a request of this window
    values: dict[str, float]  # split -> the window's metric (mean over seeds)


class WindowAdvice(NamedTuple):
    window_s: float
    windows: list[Window]
    pattern: list[str]  # the winners with repeats collapsed
    oscillating: bool

    @property
    def switches(self) -> int:
        """Switches a planner following the winners would make (from the first winner)."""
        return max(len(self.pattern) - 1, 0)

    def to_json(self) -> dict[str, Any]:
        return {
            "window_s": self.window_s,
            "best": [w._asdict() for w in self.windows],
            "pattern": self.pattern,
            "oscillating": self.oscillating,
            "switches": self.switches,
        }


class Recommendation(NamedTuple):
    split: str
    value: float  # the ranking metric over the run, the switch from the run's split included
    stay_value: float | None  # the run's own split's value (None: the run had no PD split)
    reason: str
    # whether the best split's 95% interval is clear of the next best's (None: one split)
    distinguishable: bool | None = None
    runner_up: str | None = None


def order(value: float) -> float:
    """Sort key of a latency: lower is better, a missing (NaN) value last."""
    return value if np.isfinite(value) else float("inf")


def window_best(
    runs: dict[str, list[Timings]], metric: str, t0: float, t_last: float, window_s: float
) -> WindowAdvice:
    """Per window, the split whose replays did best on `metric` (module docstring)."""
    count = max(int(np.ceil((t_last - t0) / window_s - 1e-9)), 1)
    windows = []
    for i in range(count):
        a, b = t0 + i * window_s, t0 + (i + 1) * window_s
        last = i == count - 1
        values: dict[str, float] = {}
        num = 0
        for split, seeds in runs.items():
            per_seed = []
            for t in seeds:
                inside = (t.t_arrival >= a) & (
                    (t.t_arrival <= t_last) if last else (t.t_arrival < b)
                )
                num = max(num, int(inside.sum()))
                if inside.any():
                    sub = Timings(*(x[inside] for x in t))
                    per_seed.append(
                        metric_values(sub, np.arange(int(inside.sum()))[None, :])[metric][0]
                    )
            finite = [v for v in per_seed if np.isfinite(v)]
            if finite:
                values[split] = float(np.mean(finite))
        best = min(values, key=lambda s: (values[s], s)) if values else None
        windows.append(Window(a, min(b, t_last) if last else b, num, best, values))
    pattern: list[str] = []
    for w in windows:
        if w.best is not None and (not pattern or pattern[-1] != w.best):
            pattern.append(w.best)
    return WindowAdvice(window_s, windows, pattern, len(pattern) > len(set(pattern)))


def recommend(
    splits: list[SplitAdvice], current: str | None, metric: str, windows: WindowAdvice
) -> Recommendation:
    """The split best over the run with the switch included (module docstring)."""

    def est(s: SplitAdvice) -> Any:
        if s.split == current or s.switch is None:
            return s.metrics[metric]
        return s.switch.metrics[metric]

    def total(s: SplitAdvice) -> float:
        return float(est(s).mean)

    ranked = sorted(splits, key=lambda s: (s.unfinished > 0, order(total(s)), s.prefill))
    best = ranked[0]
    value = total(best)
    if current is None:
        reason = (
            f"{best.split} has the best {metric} over the run ({value:.4g}); the run had no PD "
            "split of these nodes, so no switch cost is counted"
        )
        stay = None
    else:
        stay = next(s.metrics[metric].mean for s in splits if s.split == current)
        if best.split == current:
            reason = f"stay on {current}: no split beats it over the run once its switch is paid"
        elif best.switch is None:  # to or from collocated engines: a relaunch, not modelled
            reason = (
                f"move {current} -> {best.split}: {metric} {value:.4g} over the run against "
                f"{stay:.4g} staying; the move relaunches the engines in their new roles, "
                "whose cost is not modelled (none counted)"
            )
        else:
            assert best.switch is not None
            reason = (
                f"switch {current} -> {best.split}: {metric} {value:.4g} over the run with the "
                f"switch at t={best.switch.t_switch_s:.4g} s included, against {stay:.4g} staying"
            )
    distinct: bool | None = None
    runner = ranked[1] if len(ranked) > 1 else None
    if runner is not None:
        (a_lo, a_hi), (b_lo, b_hi) = est(best).ci95, est(runner).ci95
        known = np.isfinite(a_hi) and np.isfinite(b_hi)
        distinct = bool(known and (a_hi < b_lo or b_hi < a_lo))
        if not known:
            reason += (
                f"; not distinguishable from {runner.split}: the intervals have no upper end "
                "(the twin's error leaves them not known)"
            )
        elif not distinct:
            reason += (
                f"; not distinguishable from {runner.split}: their 95% intervals overlap "
                f"({a_lo:.4g}-{a_hi:.4g} vs {b_lo:.4g}-{b_hi:.4g})"
            )
    if windows.oscillating:
        reason += (
            f"; the best split alternates between windows ({' -> '.join(windows.pattern)}): "
            f"following it would switch {windows.switches} times, so take {best.split}, the "
            "best over the whole run"
        )
    return Recommendation(
        best.split, value, stay, reason, distinct, None if runner is None else runner.split
    )
