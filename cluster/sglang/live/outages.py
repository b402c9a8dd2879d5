"""Engines that went down during a live run, and how the run records them (SPEC §3, §6).

An engine is down when its health checks fail (`fleet.EngineFleet.check_health`) or a
request finds it dead (the proxy); it is dead when its process exited (a launched engine).
`Outages`, kept by the fleet (`EngineFleet.mark_down`, `mark_up`, `mark_dead`), holds one
entry per outage — node, when, why, when it came back — for the run's summary. A dead
engine's KV is gone: its blocks leave the directory and the `kv_events` table gets a
`cleared` row per tier at the time of death. A run that ends with
an engine still down, or after one died, is closed as `failed` with the outages as its
detail (`pdlab_run_status`), its rows kept — never `finished` as if nothing had happened.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

from cluster.core import TelemetrySink
from cluster.sglang.live.telemetry_run import LockedSink

log = logging.getLogger(__name__)
TIERS = ("gpu", "host")


@dataclass(slots=True)
class Outage:
    """One engine out of service: from `t_down` (run seconds) until `t_up` (None: still)."""

    node_id: int
    url: str
    t_down: float
    reason: str
    t_up: float | None = None
    died: bool = False  # its process exited

    def describe(self) -> str:
        what = "died" if self.died else "down"
        until = "" if self.t_up is None else f" until t={self.t_up:.1f} s"
        return (
            f"engine {self.node_id} ({self.url}) {what} at t={self.t_down:.1f} s{until}: "
            + (self.reason[:200])
        )


class Outages:
    """The outages of one run (call with the cluster's lock held)."""

    def __init__(self, sink: TelemetrySink | None) -> None:
        self.sink = sink
        self.log: list[Outage] = []

    def current(self, node: int) -> Outage | None:
        return next((o for o in reversed(self.log) if o.node_id == node and o.t_up is None), None)

    def down(self, node: int, url: str, now: float, reason: str) -> None:
        if self.current(node) is None:
            self.log.append(Outage(node, url, now, reason))

    def up(self, node: int, now: float) -> None:
        o = self.current(node)
        if o is not None and not o.died:
            o.t_up = now

    def died(self, node: int, url: str, now: float, reason: str) -> None:
        """The engine's process exited: its KV is gone (a `cleared` row per tier)."""
        o = self.current(node)
        if o is None:
            o = Outage(node, url, now, reason)
            self.log.append(o)
        o.died, o.reason = True, reason
        if self.sink is not None:
            self.sink.emit(
                "kv_events",
                {"t": [now] * len(TIERS), "node_id": [node] * len(TIERS), "tier": list(TIERS),
                 "kind": ["cleared"] * len(TIERS), "block_hash": [None] * len(TIERS),
                 "parent_hash": [None] * len(TIERS), "num_tokens": [0] * len(TIERS)},
            )  # fmt: skip

    def nodes_down(self) -> list[int]:
        return sorted({o.node_id for o in self.log if o.t_up is None})

    def end_detail(self) -> str | None:
        """Why the run did not finish whole (engines dead or still down), or None."""
        open_ = [o for o in self.log if o.t_up is None or o.died]
        if not open_:
            return None
        return "; ".join(o.describe() for o in open_)

    def as_list(self) -> list[dict[str, Any]]:
        return [asdict(o) for o in self.log]

    def end_run(self, sink: LockedSink) -> None:
        """Close the run: `finished`, or `failed` with the outages when an engine died or
        is still down (the rows written are kept either way)."""
        detail = self.end_detail()
        if detail is None:
            sink.close()
            return
        log.error("run %s ends with engines out of service: %s", sink.run_id, detail)
        sink.abort(f"engines out of service: {detail}")
