"""Token-count and tool-gap distributions of agent programs (paper 003 §3.2, App. E).

A generator draws every token count from a clipped lognormal (`TokenDist`) and every pause
between a turn and its successor from a per-tool mixture (`ToolProfile`, `ToolMix`): most
calls are short, a rare "long" component (builds, test suites, user think time) holds most of
the pause time. This is the shape TraceLab reports for coding agents (calls > 1 min are 4% of
calls but 85% of tool time, paper 003 §1) and what per-tool TTL policies (the 0.9 quantile of
observed gaps per tool, App. E) learn from, so each gap carries the name of the tool it waited
for.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from math import exp

import numpy as np

from cluster.core import ConfigError


@dataclass(frozen=True, slots=True)
class TokenDist:
    """A clipped lognormal token count: median `median`, shape `sigma`, clipped to [lo, hi]."""

    median: float
    sigma: float
    lo: int = 1
    hi: int = 1 << 20

    def __post_init__(self) -> None:
        if not self.median > 0:
            raise ConfigError(f"TokenDist.median must be > 0, got {self.median}")
        if self.sigma < 0:
            raise ConfigError(f"TokenDist.sigma must be >= 0, got {self.sigma}")
        if not 1 <= self.lo <= self.hi:
            raise ConfigError(f"TokenDist needs 1 <= lo <= hi, got lo={self.lo} hi={self.hi}")

    def draw(self, rng: np.random.Generator, scale: float = 1.0) -> int:
        """One count; `scale` multiplies the median (per-program variation)."""
        n = round(self.median * scale * exp(self.sigma * rng.standard_normal()))
        if n < self.lo:
            return int(self.lo)
        return int(self.hi) if n > self.hi else n

    @property
    def mean(self) -> float:
        """Mean before clipping (documentation and calibration only)."""
        return self.median * math.exp(self.sigma**2 / 2)


@dataclass(frozen=True, slots=True)
class ToolProfile:
    """One tool: how often it is called, how long it takes, how many tokens it returns.

    The gap is lognormal(median_s, sigma_s) with probability 1 - long_share and
    lognormal(long_median_s, long_sigma_s) otherwise.
    """

    tool: str
    weight: float
    median_s: float
    sigma_s: float
    result: TokenDist
    long_share: float = 0.0
    long_median_s: float = 0.0
    long_sigma_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.tool:
            raise ConfigError("ToolProfile.tool must be a non-empty name")
        if self.weight < 0:
            raise ConfigError(f"ToolProfile {self.tool!r}: weight must be >= 0, got {self.weight}")
        if not self.median_s > 0 or self.sigma_s < 0:
            raise ConfigError(f"ToolProfile {self.tool!r}: needs median_s > 0 and sigma_s >= 0")
        if not 0 <= self.long_share <= 1:
            raise ConfigError(f"ToolProfile {self.tool!r}: long_share must lie in [0, 1]")
        if self.long_share > 0 and not self.long_median_s > 0:
            raise ConfigError(f"ToolProfile {self.tool!r}: long_share > 0 needs long_median_s > 0")

    def draw_gap(self, rng: np.random.Generator) -> float:
        if self.long_share > 0 and rng.random() < self.long_share:
            return self.long_median_s * math.exp(self.long_sigma_s * rng.standard_normal())
        return self.median_s * math.exp(self.sigma_s * rng.standard_normal())

    @property
    def mean_gap_s(self) -> float:
        short = self.median_s * math.exp(self.sigma_s**2 / 2)
        long = self.long_median_s * math.exp(self.long_sigma_s**2 / 2)
        return (1 - self.long_share) * short + self.long_share * long


@dataclass(frozen=True, slots=True)
class ToolMix:
    """A categorical choice of tool per step, by `ToolProfile.weight`."""

    tools: tuple[ToolProfile, ...]
    # sum of the weights, computed once (draws are on the generators' hot path)
    _total: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.tools:
            raise ConfigError("ToolMix needs at least one ToolProfile")
        names = [t.tool for t in self.tools]
        if len(set(names)) != len(names):
            raise ConfigError(f"ToolMix has duplicate tool names: {names}")
        total = sum(t.weight for t in self.tools)
        if total <= 0:
            raise ConfigError("ToolMix weights must sum to > 0")
        object.__setattr__(self, "_total", total)

    def draw(self, rng: np.random.Generator, scale: float = 1.0) -> tuple[str, float, int]:
        """(tool name, gap in seconds, result tokens); `scale` multiplies result sizes."""
        u = rng.random() * self._total
        chosen = self.tools[-1]
        for t in self.tools:
            u -= t.weight
            if u < 0:
                chosen = t
                break
        return chosen.tool, chosen.draw_gap(rng), chosen.result.draw(rng, scale)

    @property
    def mean_gap_s(self) -> float:
        return sum(t.weight * t.mean_gap_s for t in self.tools) / self._total


class Categorical:
    """`rng.choice(len(weights), p=w)` with `w = weights / sum(weights)`, without numpy's
    per-call work (~18 us): numpy's `choice` with `p` normalizes the cdf (`cumsum`, then divide
    by its last entry), draws one `rng.random()` and returns `cdf.searchsorted(u,
    side="right")`; this computes the same cdf once and bisects it the same way, so it returns
    the same index from the same single draw (tests/cluster/workloads pins it on many seeds).
    """

    __slots__ = ("_cdf",)

    def __init__(self, weights: Sequence[float]) -> None:
        total = sum(weights)
        if not all(math.isfinite(x) and x >= 0 for x in weights) or not total > 0:
            raise ConfigError(f"categorical weights must be finite and >= 0, sum > 0: {weights}")
        cdf = (np.asarray(weights, dtype=float) / total).cumsum()
        cdf /= cdf[-1]
        self._cdf = cdf.tolist()

    def draw(self, rng: np.random.Generator) -> int:
        return bisect_right(self._cdf, rng.random())


def program_scale(rng: np.random.Generator, sigma: float) -> float:
    """A per-program multiplier with median 1 (some agents write or read more than others)."""
    return math.exp(sigma * rng.standard_normal()) if sigma > 0 else 1.0
