"""Phase switches of simulated nodes and the end of the warmup (paper 000 §4.1, §5.2, Alg. E.3).

The control plane decides a switch and asks the engines (`EngineBackend.begin_switch`):
the node's queued requests move to peers of its current phase, running ones finish in
place, and once the node is idle it serves the new phase. In place (symmetric engines,
§4.1) its KV stays in the shared pool, though a node turning to decode gives its GPU
memory to running requests; a relaunch (vLLM/SGLang/Dynamo) or a stranded switch drops
the node's KV and, for a relaunch, keeps it out of service for `relaunch_s`. At the end of
T_learn the node models are fitted and frozen (Alg. E.3 line 1) and, after a collocated
warmup, the initial split starts. The PD split over time is recorded here.
"""

from __future__ import annotations

from typing import Any

from cluster.control import ControlPlane, RouteRequest, SwitchMode
from cluster.core import Phase
from cluster.sim.kernel import SWITCH_DONE, EventKernel
from cluster.sim.node import SimNode
from cluster.sim.node_engine import NodeEngine
from cluster.sim.stage import StageContext
from cluster.sim.warmup import WarmupFit


class Switching:
    """The simulated cluster's side of phase switches (an `EngineBackend`) and the warmup's
    end. `split_timeline`: (t, prefill nodes, decode nodes); collocated counts every node
    in both."""

    def __init__(
        self, ctx: StageContext, cp: ControlPlane, engine: NodeEngine, fit: WarmupFit
    ) -> None:
        self.kernel: EventKernel = ctx.kernel
        self.cp = cp
        self.nodes: dict[int, SimNode] = ctx.nodes
        self.engine = engine
        self.fit = fit
        self.initial_phases: dict[int, Phase] = ctx.initial_phases
        self.relaunch_s = ctx.cfg.relaunch_s
        self.split_timeline: list[tuple[float, int, int]] = []
        self.switch_log: list[dict[str, Any]] = []
        self.rows: list[dict[str, Any]] = []

    def record_split(self) -> None:
        now = self.kernel.now
        if self.cp.collocated:
            self.split_timeline.append((now, len(self.nodes), len(self.nodes)))
        else:
            p, d = self.cp.split()
            self.split_timeline.append((now, p, d))

    # ---- switches -------------------------------------------------------------------------
    def begin_switch(self, node_id: int, to_phase: Phase, mode: SwitchMode, now: float) -> None:
        """EngineBackend: move queued requests to peers, let running ones finish in place."""
        node = self.nodes[node_id]
        node.switch = (to_phase, mode, now, node.running())
        cp = self.cp
        for req in self.engine.take_queue(node):
            rr = RouteRequest(req.request_id, req.program, req.branch_id, req.path, req.t_in, now)
            d = cp.reroute(rr, from_node=node_id)
            self.engine.enqueue(req, d.node_id, d.cached_tokens, d.fetch_tokens)
        if node.idle():
            self.on_node_idle(node)

    def on_node_idle(self, node: SimNode) -> None:
        """The switching node finished its running work."""
        assert node.switch is not None
        to, mode, _, running = node.switch
        node.switch = None
        lost = 0
        now = self.kernel.now
        if mode in ("relaunch", "strand"):
            lost = self.cp.node_blocks(node.id)
            node.memory.clear(now)
        if mode == "relaunch":
            node.out_of_service = True
            self.kernel.push(
                now + self.relaunch_s, SWITCH_DONE, self._relaunched, node, to, running, lost
            )
            return
        self._switched(node, to, running, lost)

    def _relaunched(self, node: SimNode, to: Phase, running: int, lost: int) -> None:
        node.out_of_service = False
        self._switched(node, to, running, lost)

    def _switched(self, node: SimNode, to: Phase, running: int, lost: int = 0) -> None:
        now = self.kernel.now
        node.phase = to
        if to == "decode":
            # GPU memory now holds running requests' KV: the prefix cache in it is gone.
            node.memory.drop_gpu_cache(now)
        sw = self.cp.switches.get(node.id)
        t_decided = sw.t_decided if sw is not None else now
        self.cp.complete_switch(node.id, now, drained=running, lost_kv_blocks=lost)
        self.rows.append({"node_id": node.id, "t_decided": t_decided, "t_done": now, "to": to})
        self.switch_log.append({"node_id": node.id, "t_done": now, "to": to})
        self.record_split()
        self.engine.schedule(node)

    # ---- the end of T_learn (Alg. E.3 line 1) -----------------------------------------------
    def end_learning(self) -> None:
        """Fit and freeze the node models; the split stays as it is."""
        self.cp.set_models(self.fit.fit())

    def end_warmup(self) -> None:
        """Fit and freeze the node models, then serve the initial split."""
        self.cp.set_models(self.fit.fit())
        now = self.kernel.now
        self.cp.start_disaggregation(self.initial_phases, now)
        for n in self.nodes.values():
            n.phase = self.initial_phases[n.id]
        self.record_split()
        for n in self.nodes.values():
            self.engine.schedule(n)
