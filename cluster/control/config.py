"""Settings of the control plane (paper 000 §5.2–5.3, App. E.3; SPEC §4): block size, the
router, decode binder and planner by registry name, the gain planner's window (T_win = 600 s,
m = 10 slices, 120 s cooldown), how the router credits KV in other nodes' host memory
(`kv_fetch`, copy price kappa), how old a node report may be, and which rows it logs."""

from __future__ import annotations

from dataclasses import dataclass

from cluster.control.planner_driver import PlannerMode
from cluster.control.planning import PLANNERS, Planner


@dataclass(frozen=True, slots=True)
class ControlPlaneConfig:
    block_tokens: int = 256
    router: str = "ttft"
    decode_binder: str = "fewest"
    planner: str = "gain"
    planner_mode: PlannerMode = "auto"
    window_s: float = 600.0
    slices: int = 10
    cooldown_s: float = 120.0
    kv_fetch: str = "async"
    copy_price_s_per_token: float = 0.0
    max_report_age_s: float = 5.0
    log_branch_counts: bool = True
    log_router_decisions: bool = True
    # Price prefill in the router and the queue estimates with each node's fitted form
    # (cluster.control.state.form_prefill_time: Eq. 3 plus a form's extra terms) instead of
    # Eq. 3 alone; the planner's Eq. 3 already includes them. Same as Eq. 3 on paper forms.
    prefill_forms: bool = False
    # A request's expected serving overheads before its first token (a live cluster's proxy,
    # engine wake-up, KV hand-off, decode join and streaming: models.overheads'
    # ServingOverheads.ttft_s); the router's predicted TTFT adds them. 0: none (Eq. 7 as is).
    ttft_overhead_s: float = 0.0
    # Modes the planner may be set to (PUT /v1/planner): an attached fleet in shadow mode
    # (`pdlab attach`) allows ("advise", "off") so nothing switches unless asked.
    planner_modes: tuple[PlannerMode, ...] = ("auto", "advise", "off")


def make_planner(cfg: ControlPlaneConfig) -> Planner:
    """The configured planner (the gain planner with the configured window)."""
    if cfg.planner == "gain":
        return PLANNERS.create(
            "gain", window_s=cfg.window_s, slices=cfg.slices, cooldown_s=cfg.cooldown_s
        )
    return PLANNERS.create(cfg.planner)
