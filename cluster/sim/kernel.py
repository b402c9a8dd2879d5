"""The simulator's event kernel: a heap of (time, priority, sequence, handler, args) (SPEC §5).

Events at equal times run in priority order (completions before new arrivals before
planning, paper 000 §6's simulated cluster), then in the order they were scheduled, so a
seeded run is deterministic. Handlers schedule further events with `push`; `step_until`
runs every event up to a time and keeps the clock, the event count and the wall time.
`halt()` ends the run early (a trace whose every request finished): no further event runs
and the clock stays at the time of the last one.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from typing import Any

# Event priorities at equal times: completions before new arrivals before planning.
FETCH, TRANSFER, PREFILL_END, DECODE_END, SWITCH_DONE, RELEASE, ARRIVAL, WARMUP, TICK = range(9)


class EventKernel:
    """The event heap and the simulated clock `now` (seconds)."""

    __slots__ = ("events_processed", "halted", "heap", "now", "seq", "wall_s")

    def __init__(self) -> None:
        self.heap: list[tuple[Any, ...]] = []
        self.seq = 0
        self.now = 0.0
        self.events_processed = 0
        self.wall_s = 0.0
        self.halted = False

    def clock(self) -> float:
        return self.now

    def push(self, t: float, priority: int, fn: Callable[..., None], *args: Any) -> None:
        """Schedule `fn(*args)` at simulated time `t`."""
        self.seq += 1
        heapq.heappush(self.heap, (t, priority, self.seq, fn, args))

    def halt(self) -> None:
        """Run no event after the current one; the clock stops where it is."""
        self.halted = True

    def step_until(
        self,
        t_end: float,
        progress: Callable[[float], None] | None = None,
        progress_step_s: float = 1.0,
    ) -> float:
        """Run every event at or before `t_end`; the clock ends at `t_end` (or later, if it
        already was; or where `halt()` stopped it). `progress(t)` is called at most once per
        `progress_step_s`."""
        wall0 = time.perf_counter()
        heap = self.heap
        pop = heapq.heappop
        next_progress = self.now
        n = 0
        while heap and heap[0][0] <= t_end and not self.halted:
            t, _, _, fn, args = pop(heap)
            self.now = t
            fn(*args)
            n += 1
            if progress is not None and t >= next_progress:
                progress(t)
                next_progress = t + progress_step_s
        self.events_processed += n
        if not self.halted:
            self.now = max(self.now, t_end)
        self.wall_s += time.perf_counter() - wall0
        return self.now
