"""Routing of the Dispatch Plane (paper 003 §3.3) composed with the PD router.

A dispatch policy implements `select(pcb, inflight, now)`: `inflight` maps each candidate
node id (the prefill-serving nodes available now, in id order) to the calls queued or
running there, and the policy returns one of those node ids. Routing is evaluated first,
at release, because the chosen node determines both the queue and whether the prefix is
resident; the decode node is then bound by the PD binder when prefill starts (in a
collocated cluster it is the same node).

Shipped (registry `DISPATCH_POLICIES`):
- `round-robin`: the candidates in turn.
- `least-loaded`: the fewest calls in flight (ties: lowest id).
- `session-affinity`: the program's prior prefill node unless it is unavailable or holds
  more than `max_inflight` calls, then the least-loaded node (SMetric-style affinity with
  a capacity fallback).

`DispatchRouter` adapts a dispatch policy to the control plane's `Router` protocol: the
chosen node uses its own cached prefix (plus the shared pool when KV fetch is enabled).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, cast

from cluster.control import ClusterView, RouteDecision, RouteRequest, local_decision
from cluster.core import ConfigError, Registry
from cluster.policies.errors import PolicyError
from cluster.policies.pcb import ProgramControlBlock, Signals


class DispatchHooks(Protocol):
    name: str
    signals: Signals

    def select(self, pcb: ProgramControlBlock, inflight: Mapping[int, int], now: float) -> int:
        """One of the node ids in `inflight`."""
        ...


class DispatchPolicy:
    """Base class for routing policies: override `select(pcb, inflight, now)`."""

    name = "custom"
    uses_signals = True
    signals: Signals = cast(Signals, None)  # set by the plane before each hook

    def select(self, pcb: ProgramControlBlock, inflight: Mapping[int, int], now: float) -> int:
        return min(inflight, key=lambda n: (inflight[n], n))


DISPATCH_POLICIES: Registry[DispatchHooks] = Registry("dispatch policy")


@DISPATCH_POLICIES.register("round-robin")
class RoundRobinDispatch(DispatchPolicy):
    name = "round-robin"
    uses_signals = False

    def __init__(self) -> None:
        self._i = 0

    def select(self, pcb: ProgramControlBlock, inflight: Mapping[int, int], now: float) -> int:
        nodes = list(inflight)
        node = nodes[self._i % len(nodes)]
        self._i += 1
        return node


@DISPATCH_POLICIES.register("least-loaded")
class LeastLoadedDispatch(DispatchPolicy):
    name = "least-loaded"
    uses_signals = False


@DISPATCH_POLICIES.register("session-affinity")
class SessionAffinityDispatch(DispatchPolicy):
    """Prior node unless over `max_inflight` calls (or gone): then the least loaded."""

    name = "session-affinity"
    uses_signals = False

    def __init__(self, max_inflight: int = 16) -> None:
        if isinstance(max_inflight, bool) or not isinstance(max_inflight, int) or max_inflight < 1:
            raise ConfigError(
                f"dispatch parameter 'max_inflight' must be an integer >= 1, got {max_inflight!r}"
            )
        self.max_inflight = max_inflight

    def select(self, pcb: ProgramControlBlock, inflight: Mapping[int, int], now: float) -> int:
        prior = pcb.last_prefill_node
        if prior is not None and prior in inflight and inflight[prior] < self.max_inflight:
            return prior
        return min(inflight, key=lambda n: (inflight[n], n))


class DispatchRouter:
    """A dispatch policy as a `cluster.control.routing.Router` (see module docstring)."""

    def __init__(
        self,
        policy: Any,
        select: Callable[[ProgramControlBlock, Mapping[int, int], float], Any],
        pcb_of: Callable[[str], ProgramControlBlock],
        inflight_of: Callable[[int], int],
        signals_of: Callable[[float], Signals] | None = None,
    ) -> None:
        self.policy = policy
        self.name = f"dispatch:{getattr(policy, 'name', type(policy).__name__)}"
        self._select = select
        self._pcb_of = pcb_of
        self._inflight_of = inflight_of
        self._signals_of = signals_of

    def route(self, req: RouteRequest, view: ClusterView) -> RouteDecision:
        nodes = view.nodes_in("prefill")
        if not nodes:
            raise ConfigError("no prefill node is available to route to")
        inflight = {n: self._inflight_of(n) for n in nodes}
        if self._signals_of is not None:
            self.policy.signals = self._signals_of(req.now)
        node = self._select(self._pcb_of(req.program_id), inflight, req.now)
        if isinstance(node, bool) or node not in inflight:
            raise PolicyError(
                f"dispatch policy {self.name!r}.select returned {node!r}; it must return one of "
                f"the candidate node ids {list(inflight)}"
            )
        return local_decision(self.name, int(node), req, view)

    def on_prefill_done(self, request_id: str, node: int) -> None:
        return None

    def on_done(self, request_id: str, node: int) -> None:
        return None
