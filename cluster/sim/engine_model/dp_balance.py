"""Which DP rank a request goes to: vLLM 0.19's internal load balancer (the twin's rule).

vLLM's front end with `data_parallel_size` > 1 (`DPLBAsyncMPClient.
get_core_engine_for_request`, vllm/v1/engine/core_client.py, v0.19.0) sends each request
to the engine with the lowest score 4 * waiting + running, scanning the ranks from 0 (one
front-end client) so a tie goes to the lowest rank, and then counts the request as waiting
on that rank in its own view. The counts come from the DP coordinator
(vllm/v1/engine/coordinator.py): each engine reports its (waiting, running) after a step
when they changed, and the coordinator publishes the latest ones every 100 ms when
something changed; a publish replaces the front end's view, local increments included.
(Later vLLM versions, after 0.19, rotate the scan start and weigh waiting by KV usage.)

`DPBalancer.choose(t, counts_at)` applies that rule for a request arriving at `t`, where
`counts_at(rank, tau)` gives a rank's (waiting, running) after its last iteration that
ended at or before `tau` (the replay's traces).
"""

from __future__ import annotations

import math
from collections.abc import Callable

STATS_INTERVAL_S = 0.1  # the coordinator's publish period (stats_update_interval_ms)
WAITING_WEIGHT = 4  # score = 4 * waiting + running


class DPBalancer:
    """The front end's view of the ranks' load and its choice (module docstring)."""

    def __init__(self, num_ranks: int, interval_s: float = STATS_INTERVAL_S) -> None:
        if num_ranks < 1 or interval_s <= 0:
            raise ValueError(
                f"need >= 1 rank and a positive interval, got {num_ranks}, {interval_s}"
            )
        self.num_ranks, self.interval_s = num_ranks, interval_s
        self.view = [[0, 0] for _ in range(num_ranks)]  # [waiting, running] per rank
        self._published: list[tuple[int, int]] | None = None
        self._next_publish = -math.inf

    def _refresh(self, t: float, counts_at: Callable[[int, float], tuple[int, int]]) -> None:
        if t < self._next_publish:
            return
        tick = math.floor(t / self.interval_s) * self.interval_s
        counts = [counts_at(r, tick) for r in range(self.num_ranks)]
        if counts != self._published:  # the coordinator publishes only changes
            self._published = counts
            self.view = [[w, r] for w, r in counts]
        self._next_publish = tick + self.interval_s

    def choose(self, t: float, counts_at: Callable[[int, float], tuple[int, int]]) -> int:
        """The rank of a request arriving at `t` s, counted as waiting there afterwards."""
        self._refresh(t, counts_at)
        scores = [WAITING_WEIGHT * w + r for w, r in self.view]
        rank = scores.index(min(scores))
        self.view[rank][0] += 1
        return rank
