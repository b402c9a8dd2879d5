"""Admission and placement: the control plane's data path (paper 000 §5.3, Alg. E.1–E.3).

A request is admitted (its branch updated, Alg. E.1/E.2), routed to a prefill node, bound to
a decode node when its prefill starts and released when it finishes; a placement that will
not run (a failed attempt, a request moved off a switching node) is undone in one call, so
the router, the pending work and the decode binding change together.
"""

from __future__ import annotations

from cluster.control.parts import ControlPlaneParts
from cluster.control.routing import decision_row
from cluster.control.state import QueuedWork, RouteDecision, RouteRequest
from cluster.kv.branches import BranchKind


class Placement(ControlPlaneParts):
    """`ControlPlane`'s admission and placement methods (module docstring)."""

    def admit(
        self,
        req: RouteRequest,
        *,
        branch_kind: BranchKind = "start",
        parent_id: str | None = None,
    ) -> RouteDecision:
        """A request arrives: update its branch (Alg. E.1/E.2), route it, count it on the node."""
        self._now = req.now
        self._branches.on_request(
            req.branch_id,
            list(req.path),
            req.now,
            program_id=req.program_id,
            kind=branch_kind,
            parent_id=parent_id,
        )
        decision = self.route(req)
        self._branches.place(req.branch_id, decision.node_id, req.now)
        self._in_service += 1
        self._stats.record_decode_load(req.now, self._in_service)
        return decision

    def route(self, req: RouteRequest) -> RouteDecision:
        """Route without touching branch state (also used to re-route queued requests)."""
        decision = self._router.route(req, self._view)
        t_c = decision.cached_tokens + decision.fetch_tokens
        self._state.record_sent(
            decision.node_id, QueuedWork(req.request_id, max(req.t_in - t_c, 1), t_c), req.now
        )
        if self._config.log_router_decisions:
            self._sink.emit("router_decisions", decision_row(req, decision))
        return decision

    def reroute(self, req: RouteRequest, from_node: int | None = None) -> RouteDecision:
        """Route a request again: a queued request of a switching node, or a retry.

        With `from_node`, the request is first released there (`release_placement`).
        """
        if from_node is not None:
            self.release_placement(req.request_id, from_node)
        decision = self.route(req)
        if req.branch_id in self._branches.branches:
            self._branches.place(req.branch_id, decision.node_id, req.now)
        return decision

    def bind_decode(self, req: RouteRequest, prefill_node: int, kv_tokens: int) -> int:
        """Prefill starts: choose the decode node and count the branch there."""
        if self._collocated:
            node = prefill_node
        else:
            node = self._binder.bind(req, kv_tokens, self._view)
            if req.branch_id in self._branches.branches:
                self._branches.place(req.branch_id, node, req.now)
        self._state.decode_load[node] = self._state.decode_load.get(node, 0) + 1
        return node

    def release_placement(
        self, request_id: str, prefill_node: int, decode_node: int | None = None
    ) -> None:
        """Undo one placement of a request that will not run there (a failed attempt, a
        request moved off a switching node): the router forgets it on `prefill_node`, it no
        longer counts as sent there, and its decode binding (if any) is released. Branch
        counts stay: the next placement moves them (Alg. E.2). Safe to call twice."""
        self._router.on_prefill_done(request_id, prefill_node)  # a router forgets its
        self._router.on_done(request_id, prefill_node)  # prefill and service entries
        self._state.release_sent(prefill_node, request_id)
        if decode_node is not None:
            self._unbind(decode_node)

    def _unbind(self, decode_node: int) -> None:
        load = self._state.decode_load
        load[decode_node] = max(load.get(decode_node, 0) - 1, 0)

    def on_prefill_done(self, req: RouteRequest, node: int, t: float) -> None:
        """The prefill node now holds the branch's current version."""
        self._branches.confirm(req.branch_id, node, t)
        self._router.on_prefill_done(req.request_id, node)

    def on_transfer_done(self, branch_id: str, decode_node: int, t: float) -> None:
        """The decode node received the request's KV: it holds the current version."""
        if not self._collocated:
            self._branches.confirm(branch_id, decode_node, t)

    def on_request_done(
        self,
        request_id: str,
        prefill_node: int,
        decode_node: int,
        t: float,
        *,
        t_uc: float,
        t_c: float,
        attn_pairs: float,
        t_out: float,
        t_acc: float,
    ) -> None:
        self._unbind(decode_node)
        self._in_service = max(self._in_service - 1, 0)
        self._stats.record_decode_load(t, self._in_service)
        self._router.on_done(request_id, prefill_node)
        self._stats.record_request(t, t_uc, attn_pairs, t_c, t_out, t_acc)

    def on_request_abandoned(self, t: float) -> None:
        """An admitted request failed for good (a live engine died): it leaves service.

        Its last placement is undone separately (`release_placement`)."""
        self._in_service = max(self._in_service - 1, 0)
        self._stats.record_decode_load(t, self._in_service)

    def on_branch_finish(self, branch_id: str, t: float) -> None:
        """The harness reports the branch finished (an unknown or finished one: nothing)."""
        self._branches.finish(branch_id, t)
