"""Online serving overheads of a live PD cluster, for its router and planner (paper 000 §5.3).

The forward passes are priced by the nodes' models; what a request spends around them (the
proxy's routing and HTTP, the KV hand-off, the decode engine's join, the answer's way back)
and what every pass's engine loop spends outside the forward are measured as the cluster
serves (`request_stages` stamps, the iteration rows' overhead_s) and kept for the last
`window` requests and passes. `overheads()` fits them (models.overheads) for the control
plane: the router adds `ttft_s` to its predicted TTFT, the planner's Eq. 3-4 price each
pass's CPU overhead (models.occupancy.PassOverhead).

Online, every request's join counts (the router's queue estimate holds no decode pass, so
waiting for one is overhead to it), and the prefill wake-up is not separated from queueing
(the router's W_n prices the queue; `toolkit.fit.overheads` does the offline split).
"""

from __future__ import annotations

from collections import deque

from cluster.live.live_request import LiveRequest
from models.overheads import ServingOverheads, StageFit

MIN_SAMPLES = 20
# stage -> (from, to) columns of a request's `requests` and `request_stages` rows
_SPANS = {
    "ingress": ("t_arrival", "t_prefill_queued"),
    "handoff": ("t_prefill_done", "t_kv_ready"),
    "join": ("t_kv_ready", "t_decode_join"),
    "first_out": ("t_first_emit", "t_first_token"),
    "prefill_out": ("t_prefill_done", "t_prefill_answer"),
}


class OverheadStats:
    """Recent stage durations (see module docstring); not thread-safe (call under cp.lock)."""

    def __init__(self, window: int = 2000) -> None:
        self.window = window
        self._stages: dict[str, deque[float]] = {}
        self._passes: dict[str, deque[tuple[float, float]]] = {}

    def _add(self, stage: str, value: float | None) -> None:
        if value is not None and value >= 0:
            self._stages.setdefault(stage, deque(maxlen=self.window)).append(value)

    def add_request(self, rec: LiveRequest, run_start_wall: float) -> None:
        """A completed request's stages (its `request_stages` row with its times)."""
        row = {k: v[0] for k, v in rec.stage_row(run_start_wall).items()}
        row |= {"t_arrival": rec.t_arrival, "t_first_token": rec.t_first_token,
                "t_done": rec.t_done}  # fmt: skip
        for stage, (start, end) in _SPANS.items():
            a, b = row.get(start), row.get(end)
            if a is not None and b is not None:
                self._add(stage, b - a)
        last, answer = row.get("t_last_emit"), row.get("t_prefill_answer")
        if last is not None and rec.t_done is not None:
            self._add("last_out", rec.t_done - max(last, answer if answer is not None else last))

    def add_pass(self, phase: str, overhead_s: float | None, seqs: int) -> None:
        if overhead_s is not None and overhead_s >= 0:
            q = self._passes.setdefault(f"{phase}_pass", deque(maxlen=self.window))
            q.append((overhead_s, float(seqs)))

    def overheads(self) -> ServingOverheads:
        """The stages with at least MIN_SAMPLES recent durations, fitted."""
        fits = {
            s: StageFit.fit(s, list(q)) for s, q in self._stages.items() if len(q) >= MIN_SAMPLES
        }
        for stage, q in self._passes.items():
            if len(q) >= MIN_SAMPLES:
                xs, ns = zip(*q, strict=True)
                fits[stage] = StageFit.fit(stage, xs, ns)
        return ServingOverheads(fits)
