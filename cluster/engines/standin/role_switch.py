"""SGLang's `/pd_role_switch` on the stand-in: the same preconditions, messages and replies.

SGLang 0.5.23 (`--enable-pd-role-switch`) switches an idle PD instance between prefill and
decode in place and releases its prefix cache (AllBlocksCleared on the KV event stream;
paper 000 §4.1–4.2 keeps that cache, SGLang does not). A first flip to decode needs the
decode CUDA-graph footprint of a peer (`decode_cuda_graph_memory_gb`) and enough free device
memory for it (`StandinEngine.free_gpu_memory_gb`); `prepare_only` checks without switching.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi.responses import JSONResponse

from cluster.engines.shell.http_input import BadRequest, opt_number
from cluster.engines.shell.sglang_http import role_switch_refusal, role_switch_reply

if TYPE_CHECKING:
    from cluster.engines.standin.server import StandinEngine


def role_switch(engine: StandinEngine, body: dict[str, Any]) -> JSONResponse:
    """SGLang's /pd_role_switch: same preconditions, messages and reply fields."""
    sched = engine.sched
    raw_role = body.get("new_role")
    new_role = raw_role.lower() if isinstance(raw_role, str) else ""
    old_role = sched.role

    def reply(success: bool, message: str, safe: bool = False) -> JSONResponse:
        return role_switch_reply(old_role, new_role, success, message, safe)

    refused = role_switch_refusal(engine.enable_pd_role_switch, old_role, new_role)
    if refused is not None:
        return reply(*refused)

    def switch() -> str | None:
        if engine.inflight or sched.waiting or sched.running:
            return "instance is not idle; drain all requests before switching"
        # An instance that never ran decode has no decode CUDA graphs: SGLang needs the
        # graph footprint of a decode peer before capturing them on the flip.
        if new_role == "decode" and not engine.decode_graphs_captured:
            if body.get("decode_cuda_graph_memory_gb") is None:
                return "decode_cuda_graph_memory_gb is required before capturing decode graphs"
            try:
                need = opt_number(body, "decode_cuda_graph_memory_gb", 0.0) or 0.0
            except BadRequest:
                return "decode_cuda_graph_memory_gb must be a finite, non-negative number"
            if engine.free_gpu_memory_gb < need:
                return (
                    "insufficient decode CUDA graph headroom: "
                    f"required={need:.3f} GB, available={engine.free_gpu_memory_gb:.3f} GB"
                )
        if body.get("prepare_only"):
            return "ready"
        sched.cache.reset()  # releases the prefix cache -> AllBlocksCleared
        sched.role = new_role  # type: ignore[assignment]
        if new_role == "decode":
            engine.decode_graphs_captured = True
        return None

    problem = sched.run_exclusive(switch)
    if problem == "ready":
        return reply(True, "ready", True)
    if problem is not None:
        return reply(False, str(problem), True)
    engine.role = new_role  # type: ignore[assignment]
    return reply(True, "ok")
