"""Scheduling priority of the Dispatch Plane (paper 003 §3.3, Eq. 3-4).

Within a node, calls with a smaller priority q run first; release time breaks ties (then the
order of release). q is computed once, when the call is released: q = pi(x_p(r), s(r)).
The node's prefill queue and its decode admission follow q, and under KV pressure the
running call with the largest q is preempted first (vLLM's priority scheduling); under
`fcfs`, the call that joined the running batch last (vLLM's FCFS scheduling).

Shipped (registry `SCHEDULING_POLICIES`):
- `fcfs`: q = r_{p,k}, the release time. As the default it keeps the node's queue in
  arrival order at the node (which is release order except for calls moved off a switching
  node), exactly the simulator's historical FIFO.
- `program-fcfs`: q = a_p, the program's arrival (Continuum).
- `plas`: q = A_p(r), the service the program has attained (Autellix's program-level
  least-attained-service), A_p = sum of C_{p,j} over completed calls, C the wall time from
  first admission to completion (excluding the first queueing, including preemptions).
"""

from __future__ import annotations

import math
from typing import Any, Protocol, cast

from cluster.core import Registry
from cluster.policies.errors import PolicyError
from cluster.policies.pcb import ProgramControlBlock, Signals


class SchedulingHooks(Protocol):
    name: str
    signals: Signals

    def priority(self, pcb: ProgramControlBlock, now: float) -> float:
        """Smaller runs first (integers in paper 003's listings; any real number here)."""
        ...


class SchedulingPolicy:
    """Base class for scheduling policies: override `priority(pcb, now)`."""

    name = "custom"
    uses_signals = True
    signals: Signals = cast(Signals, None)  # set by the plane before each hook

    def priority(self, pcb: ProgramControlBlock, now: float) -> float:
        return now


def check_priority(value: Any, policy: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise PolicyError(
            f"scheduling policy {policy!r}.priority returned {value!r}; it must return a real "
            "number (smaller runs first)"
        )
    return float(value)


SCHEDULING_POLICIES: Registry[SchedulingHooks] = Registry("scheduling policy")


@SCHEDULING_POLICIES.register("fcfs")
class FCFS(SchedulingPolicy):
    name = "fcfs"
    uses_signals = False

    def priority(self, pcb: ProgramControlBlock, now: float) -> float:
        return now


@SCHEDULING_POLICIES.register("program-fcfs")
class ProgramFCFS(SchedulingPolicy):
    name = "program-fcfs"
    uses_signals = False

    def priority(self, pcb: ProgramControlBlock, now: float) -> float:
        return pcb.arrival_s


@SCHEDULING_POLICIES.register("plas")
class PLAS(SchedulingPolicy):
    name = "plas"
    uses_signals = False

    def priority(self, pcb: ProgramControlBlock, now: float) -> float:
        return pcb.attained_service_s
