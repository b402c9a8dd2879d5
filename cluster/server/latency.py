"""Rolling request latency and the timeline of a live cluster (SPEC §5 metrics, §6).

`RollingLatency` keeps TTFT and E2E of the requests finished in the last `window_s` seconds
of the cluster's clock (the dashboard's latency plot, the Prometheus quantiles); engines
hand it each completed request (`ClusterEngines.set_request_listener`). `Timeline` keeps
one sample of split, latency and queue per sampling period for the dashboard's plots.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np

from cluster.control import CompletedRequest

TIMELINE_COLUMNS = (
    "t", "prefill", "decode", "ttft_p50_s", "ttft_p95_s", "e2e_p50_s", "throughput_rps", "queued",
)  # fmt: skip


def num(v: float | None) -> float | None:
    """JSON has no inf/nan: None stands for 'no value'."""
    return None if v is None or not math.isfinite(v) else float(v)


def nan(v: float | None) -> float:
    """A timeline cell: NaN stands for 'no value'."""
    return math.nan if v is None else float(v)


class RollingLatency:
    """TTFT / E2E of the requests finished in the last `window_s` seconds (cluster clock)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._done: deque[tuple[float, float, float]] = deque()  # (t_done, ttft, e2e)
        self.completed = 0

    def add(self, r: CompletedRequest) -> None:
        """One finished request; a request without a first token counts TTFT = E2E."""
        first = r.t_first_token if r.t_first_token is not None else r.t_done
        self._done.append((r.t_done, first - r.t_arrival, r.t_done - r.t_arrival))
        self.completed += 1

    def stats(self, now: float, in_flight: int) -> dict[str, Any]:
        while self._done and self._done[0][0] < now - self.window_s:
            self._done.popleft()
        rows = np.array(self._done, dtype=np.float64).reshape(-1, 3)
        span = min(self.window_s, now) if now > 0 else self.window_s
        out: dict[str, Any] = {
            "window_s": self.window_s,
            "requests": int(rows.shape[0]),
            "in_flight": in_flight,
            "throughput_rps": num(rows.shape[0] / span) if span > 0 else None,
        }
        for name, col in (("ttft", 1), ("e2e", 2)):
            v = rows[:, col]
            out[f"{name}_mean_s"] = num(float(v.mean())) if v.size else None
            out[f"{name}_p50_s"] = num(float(np.percentile(v, 50))) if v.size else None
            out[f"{name}_p95_s"] = num(float(np.percentile(v, 95))) if v.size else None
        return out


class Timeline:
    """The last `max_samples` samples of `TIMELINE_COLUMNS` (NaN: no value)."""

    def __init__(self, max_samples: int) -> None:
        self.rows: deque[tuple[float, ...]] = deque(maxlen=max_samples)

    def sample(
        self, t: float, split: tuple[int, int], latency: dict[str, Any], queued: int
    ) -> None:
        self.rows.append(
            (
                t,
                split[0],
                split[1],
                nan(latency["ttft_p50_s"]),
                nan(latency["ttft_p95_s"]),
                nan(latency["e2e_p50_s"]),
                nan(latency["throughput_rps"]),
                queued,
            )
        )

    def columns(self, since: float = 0.0) -> dict[str, list[float | None]]:
        rows = [r for r in self.rows if r[0] >= since]
        return {c: [num(r[i]) for r in rows] for i, c in enumerate(TIMELINE_COLUMNS)}
