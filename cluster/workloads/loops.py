"""Closed and open agent loops (paper 000 §6.1 and App. D.3; paper 003 §4).

Closed loop: a fixed number of agents; each finished agent is replaced at once by a new one
(`source.next_program(now)`), so a slower system also receives requests more slowly. Open loop:
agents arrive in a Poisson process whatever the system does; at most `max_active` run at once
and the others wait, first come first served, for admission (paper 000 App. D.3: at most 258
agents; the admission wait counts toward the first request's TTFT and E2E). These are value
objects and a small admission queue for the simulator's event loop to use; they never look at
a program's turns.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from cluster.core import ConfigError
from cluster.workloads.program import Program


@dataclass(frozen=True, slots=True)
class ClosedLoop:
    """`concurrency` agents at all times; a finished agent is replaced immediately."""

    concurrency: int

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigError(f"closed loop concurrency must be >= 1, got {self.concurrency}")


@dataclass(frozen=True, slots=True)
class OpenLoop:
    """Poisson agent arrivals at `rate_per_s`; at most `max_active` agents run at once."""

    rate_per_s: float
    max_active: int = 258

    def __post_init__(self) -> None:
        if not self.rate_per_s > 0:
            raise ConfigError(f"open loop rate_per_s must be > 0, got {self.rate_per_s}")
        if self.max_active < 1:
            raise ConfigError(f"open loop max_active must be >= 1, got {self.max_active}")

    def arrivals(self, seed: int, until_s: float, start_s: float = 0.0) -> Iterator[float]:
        """Arrival times in [start_s, until_s), exponential inter-arrival times."""
        rng = np.random.default_rng([seed, 0x10AD])
        t = start_s
        while True:
            t += float(rng.exponential(1.0 / self.rate_per_s))
            if t >= until_s:
                return
            yield t


class AdmissionQueue:
    """FIFO admission of arrived agents under an active-agent limit."""

    def __init__(self, max_active: int) -> None:
        if max_active < 1:
            raise ConfigError(f"max_active must be >= 1, got {max_active}")
        self.max_active = max_active
        self.active = 0
        self._waiting: deque[tuple[float, Program]] = deque()

    def arrive(self, now: float, program: Program) -> list[tuple[float, Program]]:
        """Register an arrival; returns the (arrival time, program) pairs admitted now."""
        self._waiting.append((now, program))
        return self._admit()

    def finish(self) -> list[tuple[float, Program]]:
        """An active agent finished; returns the agents admitted into its slot."""
        if self.active <= 0:
            raise ValueError("finish() without an active agent")
        self.active -= 1
        return self._admit()

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def _admit(self) -> list[tuple[float, Program]]:
        admitted = []
        while self._waiting and self.active < self.max_active:
            admitted.append(self._waiting.popleft())
            self.active += 1
        return admitted
