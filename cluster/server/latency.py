"""Rolling request latency of the live cluster: TTFT and E2E over recent simulated time.

The dashboard's latency plot and the Prometheus quantiles (SPEC §5 metrics: TTFT, E2E) come
from here; the JSON form of a planner evaluation (paper 000 Eq. 6 candidates) too.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np

from cluster.sim.engine import SimRequest


def num(v: float | None) -> float | None:
    """JSON has no inf/nan: None stands for 'no value'."""
    return None if v is None or not math.isfinite(v) else float(v)


class LatencyTracker:
    """Rolling TTFT / E2E of requests finished in the last `window_s` simulated seconds.

    Follows `sim.requests` (append-only) with a cursor and keeps only the requests in flight,
    so an update costs O(in flight), not O(all requests).
    """

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._cursor = 0
        self._open: list[SimRequest] = []
        self._done: deque[tuple[float, float, float]] = deque()  # (t_done, ttft, e2e)
        self.completed = 0

    def update(self, requests: list[SimRequest], now: float) -> None:
        if self._cursor < len(requests):
            self._open.extend(requests[self._cursor :])
            self._cursor = len(requests)
        still: list[SimRequest] = []
        finished: list[tuple[float, float, float]] = []
        for r in self._open:
            if r.t_done is None:
                still.append(r)
                continue
            ttft = (r.t_first_token if r.t_first_token is not None else r.t_done) - r.t_arrival
            finished.append((r.t_done, ttft, r.t_done - r.t_arrival))
        self._open = still
        self.completed += len(finished)
        self._done.extend(sorted(finished))
        while self._done and self._done[0][0] < now - self.window_s:
            self._done.popleft()

    def stats(self, now: float) -> dict[str, Any]:
        rows = np.array(self._done, dtype=np.float64).reshape(-1, 3)
        span = min(self.window_s, now) if now > 0 else self.window_s
        out: dict[str, Any] = {
            "window_s": self.window_s,
            "requests": int(rows.shape[0]),
            "in_flight": len(self._open),
            "throughput_rps": num(rows.shape[0] / span) if span > 0 else None,
        }
        for name, col in (("ttft", 1), ("e2e", 2)):
            v = rows[:, col]
            out[f"{name}_mean_s"] = num(float(v.mean())) if v.size else None
            out[f"{name}_p50_s"] = num(float(np.percentile(v, 50))) if v.size else None
            out[f"{name}_p95_s"] = num(float(np.percentile(v, 95))) if v.size else None
        return out


def decision_json(d: Any) -> dict[str, Any]:
    return {
        "t": d.t,
        "current_prefill": d.current_prefill,
        "chosen_prefill": d.chosen_prefill,
        "mode": d.mode,
        "reason": d.reason,
        "switches": [{"node": s.node_id, "to_phase": s.to_phase} for s in d.switches],
        "candidates": [
            {
                "prefill_count": c.prefill_count,
                "mean_gain": num(c.mean_gain),
                "std_gain": num(c.std_gain),
                "slices": c.slices,
                "qualified": bool(c.qualified),
            }
            for c in d.candidates
        ],
    }
