"""One proxied request of a live SGLang PD cluster and its branch identity (SPEC §6).

The branch a request belongs to comes from its headers (paper 000 Alg. E.1): `X-Branch-Id`
(absent: a one-request branch), `X-Branch-Kind` (start | fork | subagent, for a new branch;
a new branch with `X-Parent-Branch-Id` and no kind is a fork), `X-Parent-Branch-Id`,
`X-Program-Id` (default: the parent's program, else the branch id). `LiveRequest` carries a
request through its attempts with the times of the `requests` table and the engines' stage
stamps of its `request_stages` row; `EngineFailure` is one engine failing one attempt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from cluster.control import RouteRequest
from cluster.sglang import stamps as st

BRANCH_KINDS = ("start", "fork", "subagent")
H_BRANCH, H_PARENT, H_KIND, H_PROGRAM = (
    "x-branch-id",
    "x-parent-branch-id",
    "x-branch-kind",
    "x-program-id",
)


class Branch(NamedTuple):
    branch_id: str
    kind: str
    parent_id: str | None
    program_id: str | None
    anonymous: bool


def branch_identity(headers: Any, request_id: str) -> Branch:
    """The branch a request belongs to, from its headers; raises ValueError when invalid."""
    bid = (headers.get(H_BRANCH) or "").strip()
    parent = (headers.get(H_PARENT) or "").strip() or None
    kind = (headers.get(H_KIND) or "").strip().lower()
    if kind and kind not in BRANCH_KINDS:
        raise ValueError(
            f"{H_KIND} must be one of {', '.join(BRANCH_KINDS)}, got {headers.get(H_KIND)!r}"
        )
    if kind in ("fork", "subagent") and parent is None:
        raise ValueError(f"{H_KIND}: {kind} needs {H_PARENT}")
    if not kind:
        kind = "fork" if parent is not None else "start"
    program = (headers.get(H_PROGRAM) or "").strip() or None
    if not bid:
        return Branch(f"req-{request_id}", kind, parent, program, True)
    return Branch(bid, kind, parent, program, False)


@dataclass(slots=True)
class LiveRequest:
    """One proxied request (times are run seconds; names as in the `requests` table)."""

    request_id: str
    program_id: str
    branch_id: str
    route: str
    stream: bool
    t_arrival: float
    t_in: int
    path: list[int]
    anonymous: bool
    kv_tokens: int
    prefill_node: int | None = None
    decode_node: int | None = None
    bootstrap_room: int | None = None
    cached_tokens: int = 0  # router's estimate, replaced by the engine's count
    fetch_tokens: int = 0
    t_prefill_start: float | None = None
    t_prefill_done: float | None = None
    t_first_token: float | None = None
    t_done: float | None = None
    t_out: int = 0
    attempts: int = 0
    error: str | None = None
    engine_cached: bool = False  # cached_tokens came from the engine
    placed: bool = False  # an attempt holds router, in-flight and decode-load entries
    admitted: bool = False  # the control plane counts it in service (cp.admit ran)
    # Engine stage stamps (wall clock, cluster.sglang.stamps) of the committed attempt:
    # the prefill's last answer, the decode's first event, the decode's last emitted_ts.
    prefill_stamps: dict[str, float] = field(default_factory=dict)
    decode_stamps: dict[str, float] = field(default_factory=dict)
    last_emit_ts: float | None = None
    recorded: bool = False  # its end was accounted for and its row written

    def route_request(self, now: float) -> RouteRequest:
        return RouteRequest(
            self.request_id, self.program_id, self.branch_id, self.path, self.t_in, now
        )

    def row(self) -> dict[str, list[Any]]:
        """Its `requests` row."""
        return {
            "request_id": [self.request_id],
            "program_id": [self.program_id],
            "branch_id": [self.branch_id],
            "t_arrival": [self.t_arrival],
            "prefill_node": [self.prefill_node],
            "decode_node": [self.decode_node],
            "t_in": [self.t_in],
            "t_c": [min(self.cached_tokens, self.t_in)],
            "t_fetch": [self.fetch_tokens],
            "t_out": [self.t_out],
            "t_prefill_start": [self.t_prefill_start],
            "t_first_token": [self.t_first_token],
            "t_done": [self.t_done],
        }

    def stage_row(self, run_start_wall: float) -> dict[str, list[Any]]:
        """Its `request_stages` row: the engines' wall-clock stamps as run seconds (None
        where an engine did not report the stage)."""

        def run_s(ts: float | None) -> float | None:
            return None if ts is None else max(ts - run_start_wall, 0.0)

        p, d = self.prefill_stamps, self.decode_stamps
        return {
            "request_id": [self.request_id],
            "t_dispatched": [self.t_prefill_start],
            "t_prefill_received": [run_s(p.get(st.RECEIVED))],
            "t_prefill_queued": [run_s(p.get(st.QUEUED))],
            "t_prefill_forward": [run_s(p.get(st.FORWARD))],
            "t_prefill_done": [run_s(p.get(st.PREFILL_DONE))],
            "t_kv_ready": [run_s(d.get(st.KV_RECEIVED))],
            "t_decode_join": [run_s(d.get(st.DECODE_JOIN))],
            "t_first_emit": [run_s(d.get(st.EMITTED))],
            "t_last_emit": [run_s(self.last_emit_ts)],
            "t_prefill_answer": [self.t_prefill_done],
        }


class EngineFailure(Exception):
    """One engine failed one attempt; `down` when the engine looks dead (connection)."""

    def __init__(
        self, node: int, url: str, message: str, *, status: int, down: bool, retryable: bool
    ) -> None:
        super().__init__(f"engine {node} ({url}): {message}")
        self.node = node
        self.status = status
        self.down = down
        self.retryable = retryable
