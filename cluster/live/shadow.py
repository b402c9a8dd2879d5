"""What pdlab's router and planner would do on a fleet they do not steer (shadow mode).

Paper 000 App. E.3 runs the router per request and the planner per window; on an attached
fleet (`pdlab attach`) requests go through the fleet's own router, so pdlab computes the
same decisions from the same inputs — the nodes' fitted models (Eq. 1–2), their queues and
KV from /metrics and the streams, the window's requests (Eq. 5–6) — and shows them without
acting:

- router: for a request of the window's mean prompt length, the prefill node the configured
  router picks and its predicted TTFT (Eq. 7), through `ControlPlane.route` then
  `release_placement` (the decision is logged in `router_decisions`, then forgotten, so the
  node's queue estimate does not grow with requests that never went there);
- planner: the last evaluation (`ControlPlane.tick` in advise mode: a `planner_windows` row
  per candidate split, never a switch) and the split it recommends, if any qualified.
"""

from __future__ import annotations

import math
from typing import Any

from cluster.control import ControlPlane, RouteRequest


class Shadow:
    """The latest shadow recommendations (module docstring); updated under the cp lock."""

    def __init__(self) -> None:
        self.route: dict[str, Any] | None = None
        self.route_note = "no request observed yet (the mean prompt length is unknown)"
        self._n = 0

    def update(self, cp: ControlPlane, now: float, mean_prompt: float | None) -> None:
        cp.tick(now)  # advise mode: evaluates when due, never applies
        if cp.collocated:
            self.route, self.route_note = None, "the fleet runs collocated: no prefill to pick"
            return
        if mean_prompt is None or not math.isfinite(mean_prompt) or mean_prompt < 1:
            return
        if not cp.available("prefill"):
            self.route, self.route_note = None, "no prefill node is available"
            return
        self._n += 1
        rid = f"shadow-{self._n}"
        t_in = round(mean_prompt)
        d = cp.route(RouteRequest(rid, "shadow", "shadow", (), t_in, now))
        cp.release_placement(rid, d.node_id)
        self.route = {
            "t": now,
            "prompt_tokens": t_in,
            "node": d.node_id,
            "policy": d.policy,
            "predicted_ttft_s": d.predicted_ttft_s,
        }
        self.route_note = ""

    def as_json(self, cp: ControlPlane) -> dict[str, Any]:
        s = cp.planner_settings()
        d = s.last_decision
        p, dec = cp.split()
        planner: dict[str, Any] = {"name": s.name, "mode": s.mode, "current_split": f"{p}P{dec}D"}
        if cp.collocated:
            planner["note"] = "the fleet runs collocated: the planner evaluates PD splits"
        elif d is None:
            planner["note"] = (
                "no evaluation yet (the first comes one planner interval after attaching, "
                f"every {s.interval_s:.0f} s)"
            )
        else:
            total = p + dec
            best = max(d.candidates, key=lambda c: c.mean_gain, default=None)
            planner |= {
                "t": d.t,
                "recommended_split": (
                    None
                    if d.chosen_prefill is None
                    else f"{d.chosen_prefill}P{total - d.chosen_prefill}D"
                ),
                "switches": [{"node": w.node_id, "to_phase": w.to_phase} for w in d.switches],
                "reason": d.reason,
                "best_mean_gain_rps": None if best is None else _num(best.mean_gain),
                "best_std_gain_rps": None if best is None else _num(best.std_gain),
            }
        return {
            "acting": False,
            "router": self.route if self.route is not None else {"note": self.route_note},
            "planner": planner,
        }


def _num(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None
