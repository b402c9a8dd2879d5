"""Serving overheads: what a PD request spends outside the forward passes (paper 000 §4.1, §5.3).

Eq. 1-4 price forward passes; a live PD cluster adds time around them — the proxy's routing
and HTTP, the engine's intake, the KV hand-off between prefill and decode, the decode
engine taking the request into its batch, the answer's trip back through the proxy — and
each pass costs the engine's loop some CPU outside the forward (scheduling, bookkeeping,
answers). Each of those stages is measured per request (or per pass) and kept as a
distribution: empirical quantiles at `PROBS` (to read), the means of `BINS` equal-probability
bins of the sorted sample (what draws come from: a uniformly chosen bin's mean, so draws
keep the sample's mean exactly and its shape to one bin, heavy tail included, where
interpolating between quantiles would inflate the mean by the last segment to the maximum),
and a lognormal fit for reference, with the number of samples. Stages:

- `ingress`: proxy arrival -> the prefill engine's queue (tokenize, route, HTTP, intake)
- `prefill_wait`: queue -> the first pass, beyond the passes it waited for (wake-up)
- `handoff`: the prefill pass's end -> the KV in the decode engine
- `join`: the KV in the decode engine -> its batch, beyond the pass in progress then
- `first_out`: the decode engine emits the first token -> the proxy forwards it
- `prefill_out`: the prefill pass's end -> the proxy has the prefill engine's answer
- `last_out`: the later of the decode engine emitting the last token and the prefill's
  answer (a PD proxy finishes a request once both engines answered) -> the request is done
- `prefill_pass` / `decode_pass`: one pass's CPU overhead outside its forward; it grows
  with the sequences in the pass (answers, page bookkeeping per request), so it is kept as
  a distribution at one sequence plus `per_seq_s` per further sequence (least squares)

Consumers add the mean (router, planner) or draws (the cluster simulator) where the stage
happens; `ServingOverheads()` (no stages) adds nothing anywhere. One request's stages are
not independent: those that end in the proxy's event loop (first_out, prefill_out,
last_out) lag together when the proxy's host is loaded (correlation ~0.6-0.9 measured).
Where the requests' stage vectors themselves are at hand (`joint_s`: one row per measured
request, NaN where a stage was not measured for it), a request draws one row for all its
stages (`OverheadSampler.start`), keeping that dependence; absent stages, and stages of
rows that lack them, come from the marginals.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from models.occupancy import NodeModel, PassOverhead

PROBS: tuple[float, ...] = tuple(i / 20 for i in range(21))
BINS = 40
# Stages on a request's path to its first token, in order (`ServingOverheads.ttft_s`).
TTFT_STAGES = ("ingress", "prefill_wait", "handoff", "join", "first_out")
REQUEST_STAGES = (*TTFT_STAGES, "prefill_out", "last_out")
PASS_STAGES = ("prefill_pass", "decode_pass")
STAGES = (*REQUEST_STAGES, *PASS_STAGES)


@dataclass(frozen=True, slots=True)
class StageFit:
    """One stage's durations as a distribution (module docstring)."""

    stage: str
    samples: int
    mean_s: float
    quantiles_s: tuple[float, ...]  # at PROBS, nondecreasing
    bin_means_s: tuple[float, ...]  # BINS equal-probability bins' means, nondecreasing
    log_mu: float | None = None  # lognormal of the positive durations
    log_sigma: float | None = None
    per_seq_s: float = 0.0  # pass stages: seconds per sequence beyond the first

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise ValueError(f"unknown overhead stage {self.stage!r}; stages: {', '.join(STAGES)}")
        if len(self.quantiles_s) != len(PROBS):
            raise ValueError(
                f"{self.stage}: {len(self.quantiles_s)} quantiles, need {len(PROBS)} (PROBS)"
            )
        for name, v in (("quantiles", self.quantiles_s), ("bin means", self.bin_means_s)):
            if not v or any(b < a for a, b in itertools.pairwise(v)):
                raise ValueError(f"{self.stage}: {name} must be nonempty and nondecreasing")

    @classmethod
    def fit(
        cls,
        stage: str,
        durations_s: Sequence[float] | npt.NDArray[np.float64],
        seqs: Sequence[float] | npt.NDArray[np.float64] | None = None,
    ) -> StageFit:
        """The distribution of `durations_s` (finite values; negatives, which only clock
        offsets between hosts produce, count as 0). With `seqs` (a pass stage: sequences
        per pass), the slope per sequence is fitted by nonnegative least squares and the
        distribution is that of the durations brought to one sequence."""
        x = np.asarray(durations_s, dtype=np.float64)
        n = np.ones_like(x) if seqs is None else np.asarray(seqs, dtype=np.float64)
        if n.shape != x.shape:
            raise ValueError(f"{stage}: {n.size} sequence counts for {x.size} durations")
        ok = np.isfinite(x) & np.isfinite(n) & (n >= 1)
        x, n = np.maximum(x[ok], 0.0), n[ok]
        if x.size == 0:
            raise ValueError(f"{stage}: no finite durations to fit")
        slope = 0.0
        extra = n - 1.0
        if seqs is not None and extra.var() > 0:
            slope = max(float(np.cov(extra, x, bias=True)[0, 1] / extra.var()), 0.0)
            x = np.maximum(x - slope * extra, 0.0)
        q = np.quantile(x, PROBS)
        bins = _bin_means(np.sort(x), min(BINS, x.size))
        pos = x[x > 0]
        mu = sigma = None
        if pos.size >= 2:
            logs = np.log(pos)
            mu, sigma = float(logs.mean()), float(logs.std(ddof=1))
        quantiles = tuple(float(v) for v in q)
        return cls(stage, int(x.size), float(x.mean()), quantiles, bins, mu, sigma, slope)

    def mean_at(self, seqs: float = 1.0) -> float:
        """The mean duration of a pass of `seqs` sequences (a request stage: `mean_s`)."""
        return self.mean_s + self.per_seq_s * max(seqs - 1.0, 0.0)

    @property
    def draw_mean_s(self) -> float:
        """What draws average to (at one sequence): the mean of the bin means."""
        return sum(self.bin_means_s) / len(self.bin_means_s)


@dataclass(frozen=True, slots=True)
class ServingOverheads:
    """A cluster's overhead stages (module docstring); absent stages add nothing."""

    stages: Mapping[str, StageFit] = field(default_factory=dict)
    # the measured requests' stage vectors, columns `joint_stages` (module docstring)
    joint_stages: tuple[str, ...] = ()
    joint_s: npt.NDArray[np.float64] | None = field(default=None, compare=False)

    def __bool__(self) -> bool:
        return bool(self.stages)

    def get(self, stage: str) -> StageFit | None:
        return self.stages.get(stage)

    def mean_s(self, stage: str) -> float:
        """The stage's mean duration, 0 when it was not measured."""
        fit = self.stages.get(stage)
        return 0.0 if fit is None else fit.mean_s

    @property
    def ttft_s(self) -> float:
        """Expected seconds a request's first token spends in overheads (the router's and
        the planner's TTFT term): the means of TTFT_STAGES."""
        return sum(self.mean_s(s) for s in TTFT_STAGES)

    @property
    def prefill_pass_s(self) -> float:
        return self.mean_s("prefill_pass")

    @property
    def decode_pass_s(self) -> float:
        return self.mean_s("decode_pass")

    def sampler(self, seed: int) -> OverheadSampler:
        return OverheadSampler(self, np.random.default_rng(seed))


class OverheadSampler:
    """Draws of each stage (a generator of its own: a run's other draws do not move)."""

    __slots__ = ("_col", "_fits", "_joint", "_rng")

    def __init__(self, overheads: ServingOverheads, rng: np.random.Generator) -> None:
        self._fits = dict(overheads.stages)
        self._rng = rng
        joint = overheads.joint_s
        self._joint = None if joint is None or not len(joint) else joint.tolist()
        self._col = {s: i for i, s in enumerate(overheads.joint_stages)}

    def start(self) -> int:
        """A new request's row of the joint stage vectors (-1 when there are none)."""
        if self._joint is None:
            return -1
        return int(self._rng.integers(len(self._joint)))

    def has(self, stage: str) -> bool:
        return stage in self._fits

    def draw(self, stage: str, seqs: int = 1, row: int = -1) -> float:
        """One duration of `stage` (of a pass of `seqs` sequences; of the request whose
        joint row is `row`, if it measured the stage; 0.0 when it was not measured)."""
        fit = self._fits.get(stage)
        if fit is None:
            return 0.0
        col = self._col.get(stage)
        if row >= 0 and col is not None and self._joint is not None:
            v = self._joint[row][col]
            if v == v:  # not NaN
                return max(v, 0.0)
        extra = fit.per_seq_s * (seqs - 1) if seqs > 1 else 0.0
        bins = fit.bin_means_s
        return bins[int(self._rng.integers(len(bins)))] + extra


def _bin_means(sorted_x: npt.NDArray[np.float64], k: int) -> tuple[float, ...]:
    """Means of the empirical quantile function over k equal probability intervals (a
    sample value straddling two bins counts in each by its share): their average is the
    sample mean exactly, whatever k and the sample size."""
    n = sorted_x.size
    cum = np.concatenate(([0.0], np.cumsum(sorted_x)))

    def integral(t: float) -> float:  # sum of the first t (fractional) sorted values
        j = min(int(t), n - 1)
        return float(cum[j] + (t - j) * sorted_x[j])

    edges = [i * n / k for i in range(k + 1)]
    means = [(integral(b) - integral(a)) * k / n for a, b in itertools.pairwise(edges)]
    # rounding may leave a bin a hair below its predecessor: keep them nondecreasing
    return tuple(float(v) for v in np.maximum.accumulate(means))


def pass_overheads(overheads: ServingOverheads) -> tuple[PassOverhead, PassOverhead]:
    """(prefill, decode) per-pass CPU overheads for Eq. 3-4 (models.occupancy.PassOverhead):
    the pass stages' mean at one sequence and their per-sequence slope."""
    out = []
    for stage in PASS_STAGES:
        f = overheads.get(stage)
        out.append(PassOverhead() if f is None else PassOverhead(f.mean_s, f.per_seq_s))
    return out[0], out[1]


def with_pass_overheads(model: NodeModel, overheads: ServingOverheads) -> NodeModel:
    """`model` pricing each pass's CPU overhead too (Eq. 3-4's overhead term)."""
    pre, dec = pass_overheads(overheads)
    return replace(model, prefill_overhead=pre, decode_overhead=dec)
