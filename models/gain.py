"""The planner's gain test (paper 000 §5.2, Eq. 6).

g_i = Theta(candidate; w_i, q_i) - Theta(current; w_i, q_i) on each of m slices. A candidate
qualifies if mean(g) > 2 * std(g) / sqrt(m); the planner switches to the qualifying
candidate with the largest mean gain.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np


class CandidateGain(NamedTuple):
    """One candidate's result in one planning window."""

    prefill_count: int
    mean_gain: float
    std_gain: float
    slices: int
    qualified: bool


def gain_test(prefill_count: int, gains: Sequence[float]) -> CandidateGain:
    """Test one candidate's per-slice gains. std is the sample standard deviation (ddof=1).

    With one slice there is no spread estimate, so the candidate never qualifies.
    """
    g = np.asarray(gains, dtype=np.float64)
    m = int(g.size)
    if m == 0:
        return CandidateGain(prefill_count, 0.0, 0.0, 0, False)
    mean = float(g.mean())
    std = float(g.std(ddof=1)) if m > 1 else 0.0
    qualified = m > 1 and mean > 2.0 * std / np.sqrt(m)
    return CandidateGain(prefill_count, mean, std, m, bool(qualified))


def choose(candidates: Sequence[CandidateGain]) -> CandidateGain | None:
    """The qualified candidate with the largest mean gain, or None."""
    qualified = [c for c in candidates if c.qualified]
    return max(qualified, key=lambda c: c.mean_gain) if qualified else None
