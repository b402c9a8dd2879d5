"""`shift`: a workload composition shifting from Putnam to OSWorld (paper 000 §6.3, Fig. 2(b)).

Paper 000 §6.1 serves 288 concurrent Putnam agents, then 144 Putnam + 72 OSWorld agents, then
144 OSWorld agents, in three consecutive hours after the warmup, shifting demand from decode to
prefill (best split per window 3P6D -> 7P2D, Fig. 2(b)). Here the run of `duration_s` seconds
is split into a warmup of `warmup_s` (served as Putnam) and three equal periods of
(duration_s - warmup_s) / 3; `next_program(now)` picks the kind of the new agent by the period
`now` falls in:

- period 0 ("putnam"): always Putnam;
- period 1 ("mixed"): Putnam with share `mixed_putnam_share` (default 2/3 = 144 of 216 agents);
- period 2 ("osworld"): always OSWorld.

In the mixed period the kind is chosen deterministically so that the *live* agents hold the
share, without help from the loop: by Little's law the live count of a kind is proportional to
its issue rate times its lifetime, so the source stratifies by the summed estimated lifetimes
of the programs it issued in the period (choose the kind whose lifetime-weighted share is
below target). A program's lifetime is estimated on its dependency DAG as the critical path of
(`request_time_s` + gap) per turn; `request_time_s` (default 20 s) stands for the mean E2E of a
request (paper 000 App. D.1: ~24 s for OSWorld at 8P1D, ~3K-token Putnam decodes), so the
estimate is only as good as that assumption. `target_concurrency(now)` returns the paper's
288 / 216 / 144 agents for a loop that follows it. Both sub-generators draw segment ids from
one allocator.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from cluster.core import ConfigError
from cluster.workloads.osworld import OSWorldParams, OSWorldSource
from cluster.workloads.program import Program
from cluster.workloads.putnam import PutnamParams, PutnamSource
from cluster.workloads.source import GeneratorSource, check_fraction
from cluster.workloads.turn_table import TurnTable

PERIODS = ("putnam", "mixed", "osworld")


@dataclass(frozen=True, slots=True)
class ShiftParams:
    """Parameters of `shift` (paper 000 §6.1, §6.3)."""

    warmup_s: float = 0.0  # served as Putnam before the three periods start
    period_s: float = 3_600.0  # used only when make_workload gets no duration_s
    mixed_putnam_share: float = 2 / 3  # 144 Putnam of 216 agents in the mixed hour
    request_time_s: float = 20.0  # assumed mean E2E per request, for lifetime weighting
    concurrency: tuple[int, int, int] = (288, 216, 144)  # agents per period (paper 000 §6.1)
    putnam: PutnamParams = field(default_factory=PutnamParams)
    osworld: OSWorldParams = field(default_factory=OSWorldParams)

    def __post_init__(self) -> None:
        if self.warmup_s < 0:
            raise ConfigError(f"parameter 'warmup_s' must be >= 0, got {self.warmup_s}")
        if not self.period_s > 0:
            raise ConfigError(f"parameter 'period_s' must be > 0, got {self.period_s}")
        check_fraction("mixed_putnam_share", self.mixed_putnam_share)
        if self.request_time_s < 0:
            raise ConfigError(f"parameter 'request_time_s' must be >= 0, got {self.request_time_s}")
        if len(self.concurrency) != 3 or min(self.concurrency) < 1:
            raise ConfigError(
                f"parameter 'concurrency' needs three positive counts, got {self.concurrency}"
            )


class ShiftSource(GeneratorSource):
    name = "shift"
    stream = 4
    params: ShiftParams

    def __init__(
        self, params: ShiftParams, *, seed: int = 0, duration_s: float | None = None
    ) -> None:
        super().__init__(params, seed=seed, duration_s=duration_s)
        if duration_s is None:
            duration_s = params.warmup_s + 3 * params.period_s
        if not duration_s > params.warmup_s:
            raise ConfigError(
                f"shift needs duration_s > warmup_s ({params.warmup_s}), got {duration_s}"
            )
        self.duration_s = duration_s
        self.period_length_s = (duration_s - params.warmup_s) / 3
        self.putnam = PutnamSource(params.putnam, seed=seed, ids=self.ids)
        self.osworld = OSWorldSource(params.osworld, seed=seed, ids=self.ids)
        self._weight = {"putnam": 0.0, "osworld": 0.0}  # summed lifetimes issued this period
        self._period = 0

    def period(self, now: float) -> int:
        """0, 1 or 2 (`PERIODS`); the warmup counts as period 0."""
        k = int((now - self.params.warmup_s) // self.period_length_s)
        return min(2, max(0, k))

    def target_concurrency(self, now: float) -> int | None:
        return self.params.concurrency[self.period(now)]

    def next_program(self, now: float) -> Program:
        period = self.period(now)
        if period != self._period:
            self._period = period
            self._weight = {"putnam": 0.0, "osworld": 0.0}
        kind = self._choose(period)
        self._count += 1
        program = (self.putnam if kind == "putnam" else self.osworld).next_program(now)
        self._weight[kind] += lifetime_s(program, self.params.request_time_s)
        return program

    def _choose(self, period: int) -> str:
        if period == 0:
            return "putnam"
        if period == 2:
            return "osworld"
        w = self._weight
        total = w["putnam"] + w["osworld"]
        return "putnam" if w["putnam"] <= self.params.mixed_putnam_share * total else "osworld"


def lifetime_s(program: Program, request_time_s: float) -> float:
    """Critical-path estimate of a program's lifetime: each turn adds its gap and one request."""
    turns = program.turns
    steps: Iterable[tuple[Sequence[int], float]]
    if isinstance(turns, TurnTable):  # read the columns, not one Turn object per turn
        deps, gaps = turns.deps, turns.gaps()
        steps = ((deps(i), gaps[i]) for i in range(len(gaps)))
    else:
        steps = ((t.deps, t.gap_s) for t in turns)
    done: list[float] = []
    for ds, gap_s in steps:
        # one dep (most turns): its completion, what max() would return, without the generator
        ready = done[ds[0]] if len(ds) == 1 else max((done[d] for d in ds), default=0.0)
        done.append(ready + gap_s + request_time_s)
    return max(done)
