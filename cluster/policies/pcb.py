"""The Program Control Block and the system signals policies read (paper 003 §3.1-3.2).

A PCB holds exactly the non-anticipatory state x_p(t) of one program: identity, position,
attained service A_p (Eq. 3), prior placement, KV residency and protection, tool state and
context length. The simulator updates it once per event, through the PCB's own event
methods: `record_release` (call release r_{p,k}), `record_prefill_start`,
`record_preemption`, `record_completion` (call completion c_{p,k}, with the KV it leaves
cached), `record_retention` (a retention decision applied to that KV), `record_eviction`
(memory pressure reclaimed some of it) and `record_finish`. Future
output lengths, tool durations and the program's remaining turns are never stored in it
(the simulator keeps the `Program` elsewhere). The tool *name* of a gap is revealed when the
call that requested the tool completes (the model's output names it); its duration is
revealed only when the successor is released.

Policies receive the PCB itself, which is read-only to them: reading any name outside
`PCB_FIELDS` (e.g. `output_tokens`, `program`, `next_turn`) raises `PolicyError` naming the
attribute and listing what is allowed, and assignment raises too (the event methods are
the simulator's; a policy returns a decision instead). `Signals` is the same for the
deployable system signals s(t): the time, per-node KV utilization and in-flight calls, and
static engine facts (chunk budget, prefill cost per token).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from cluster.policies.errors import PolicyError

PCB_FIELDS: tuple[str, ...] = (
    "program_id",  # identity
    "workload",
    "arrival_s",  # a_p
    "turns_released",  # position: calls released so far
    "turns_completed",  # position: calls completed so far
    "attained_service_s",  # A_p: sum of C_{p,j} over completed calls (Eq. 3)
    "last_prefill_node",  # prior placement (None before the first call starts)
    "last_decode_node",
    "kv_node",  # node holding the program's latest context (None: none yet)
    "kv_resident",  # that context is fully cached on kv_node
    "kv_resident_tokens",  # cached prefix of that context on kv_node, in tokens
    "kv_protected",  # the last retention decision protects the KV and it still applies
    "kv_protected_until",  # its deadline d (None: not protected)
    "kv_value",  # its value v (None: the default, last access)
    "tool_name",  # tool of the current (or last) gap, revealed at completion
    "tool_started_s",  # when that gap began (the completion that requested the tool)
    "in_tool",  # waiting for a tool: no call queued or running
    "context_tokens",  # context length: input at release, input + output at completion
    "branch_ids",  # active branches (sub-agents, forks) of the program
    "branch_id",  # branch of the call the current decision concerns
    "calls_in_flight",  # calls released and not completed (DAG programs may run several)
    "preemptions",  # times a call of the program was preempted (recompute)
    "last_release_s",
    "last_completion_s",
    "finished",  # every call completed
)

_ALLOWED = ", ".join(PCB_FIELDS) + ", gap_elapsed_s(now)"


class ProgramControlBlock:
    """x_p(t) of one program; read-only to policies (see module docstring)."""

    __slots__ = PCB_FIELDS

    def __init__(self, program_id: str, workload: str, arrival_s: float) -> None:
        w = object.__setattr__
        w(self, "program_id", program_id)
        w(self, "workload", workload)
        w(self, "arrival_s", float(arrival_s))
        w(self, "turns_released", 0)
        w(self, "turns_completed", 0)
        w(self, "attained_service_s", 0.0)
        w(self, "last_prefill_node", None)
        w(self, "last_decode_node", None)
        w(self, "kv_node", None)
        w(self, "kv_resident", False)
        w(self, "kv_resident_tokens", 0)
        w(self, "kv_protected", False)
        w(self, "kv_protected_until", None)
        w(self, "kv_value", None)
        w(self, "tool_name", None)
        w(self, "tool_started_s", None)
        w(self, "in_tool", False)
        w(self, "context_tokens", 0)
        w(self, "branch_ids", ())
        w(self, "branch_id", None)
        w(self, "calls_in_flight", 0)
        w(self, "preemptions", 0)
        w(self, "last_release_s", None)
        w(self, "last_completion_s", None)
        w(self, "finished", False)

    # ---- the simulator's updates: one call per event (module docstring) ---------------------
    def record_release(self, now: float, context_tokens: int, branch_id: str) -> None:
        """Call release r_{p,k} on `branch_id`: one more call in flight, the tool gap over."""
        branches = self.branch_ids
        if branch_id not in branches:
            branches = (*branches, branch_id)
        w = object.__setattr__
        w(self, "turns_released", self.turns_released + 1)
        w(self, "context_tokens", context_tokens)
        w(self, "last_release_s", now)
        w(self, "in_tool", False)
        w(self, "calls_in_flight", self.calls_in_flight + 1)
        w(self, "branch_ids", branches)
        w(self, "branch_id", branch_id)

    def record_prefill_start(self, node: int) -> None:
        """A call's first prefill chunk started on `node` (prior placement)."""
        object.__setattr__(self, "last_prefill_node", node)

    def record_preemption(self) -> None:
        """A call was preempted (recompute): it will be prefilled again."""
        object.__setattr__(self, "preemptions", self.preemptions + 1)

    def record_completion(
        self,
        now: float,
        service_s: float,
        decode_node: int,
        context_tokens: int,
        tool_name: str | None,
        branch_id: str,
        *,
        branch_done: bool,
        program_done: bool,
        kv_resident_tokens: int | None = None,
        kv_resident: bool = False,
    ) -> None:
        """Call completion c_{p,k}: `service_s` (C_{p,k}) joins A_p (Eq. 3), the program's
        context (input + output) is on `decode_node`, the output names the next tool (its
        duration stays hidden); `branch_done` ends the branch. With `kv_resident_tokens`
        (KV followed per branch) the cached prefix of that context there, and whether it is
        all of it (`kv_resident`)."""
        branches = self.branch_ids
        if branch_done or program_done:
            branches = tuple(b for b in branches if b != branch_id)
        in_flight = self.calls_in_flight - 1
        w = object.__setattr__
        w(self, "turns_completed", self.turns_completed + 1)
        w(self, "attained_service_s", self.attained_service_s + service_s)
        w(self, "last_decode_node", decode_node)
        w(self, "kv_node", decode_node)
        w(self, "context_tokens", context_tokens)
        w(self, "tool_name", tool_name)
        w(self, "tool_started_s", now)
        w(self, "calls_in_flight", in_flight)
        w(self, "in_tool", in_flight == 0 and not program_done)
        w(self, "last_completion_s", now)
        w(self, "branch_ids", branches)
        w(self, "branch_id", branch_id)
        if kv_resident_tokens is not None:
            w(self, "kv_resident", kv_resident)
            w(self, "kv_resident_tokens", kv_resident_tokens)

    def record_retention(
        self,
        until: float | None,
        value: float | None,
        evicted_to_tokens: int | None = None,
    ) -> None:
        """A retention decision was applied to the program's KV: protected until `until`
        with value `value` (None: not protected), or, with `evicted_to_tokens`, evicted
        (what stays cached of the current context, in tokens)."""
        w = object.__setattr__
        w(self, "kv_protected", until is not None)
        w(self, "kv_protected_until", until)
        w(self, "kv_value", value)
        if evicted_to_tokens is not None:
            w(self, "kv_resident", False)
            w(self, "kv_resident_tokens", evicted_to_tokens)

    def record_eviction(self) -> None:
        """Memory pressure reclaimed a block of the program's KV: no longer all resident."""
        object.__setattr__(self, "kv_resident", False)

    def record_finish(self) -> None:
        """Every call completed: no tool gap, no branch left."""
        w = object.__setattr__
        w(self, "finished", True)
        w(self, "in_tool", False)
        w(self, "branch_ids", ())

    def gap_elapsed_s(self, now: float) -> float | None:
        """Seconds since the program's last call completed (the tool gap so far, or the
        whole gap when asked at the successor's release); None before any completion."""
        t = self.last_completion_s
        return None if t is None else now - t

    def __getattr__(self, name: str) -> Any:
        # Only reached for names that are not fields: a peek beyond the causal boundary.
        raise PolicyError(
            f"policies may not read PCB attribute {name!r}: future state is not visible to "
            f"policies (output lengths, tool durations and remaining turns are revealed only "
            f"by execution); allowed: {_ALLOWED}"
        )

    def __setattr__(self, name: str, value: object) -> None:
        raise PolicyError(
            f"the PCB is read-only to policies (tried to set {name!r}); a policy returns a "
            "decision instead of mutating program state"
        )

    def __delattr__(self, name: str) -> None:
        raise PolicyError(f"the PCB is read-only to policies (tried to delete {name!r})")

    def __repr__(self) -> str:
        return (
            f"PCB({self.program_id}, released={self.turns_released}, "
            f"completed={self.turns_completed}, A={self.attained_service_s:.3f}s, "
            f"ctx={self.context_tokens}, tool={self.tool_name})"
        )


def write_pcb(pcb: ProgramControlBlock, **fields: Any) -> None:
    """Set fields of a PCB directly: a PCB in a given state for tests and tools. The
    simulator updates PCBs through their event methods; policies never write."""
    w = object.__setattr__
    for name, value in fields.items():
        w(pcb, name, value)


SIGNAL_FIELDS: tuple[str, ...] = (
    "now",
    "node",  # the node the decision concerns (None: not node-specific)
    "kv_utilization",  # GPU KV utilization of that node in [0, 1] (None if no node)
    # node -> GPU KV utilization: KV of running calls over the pool for a single-pool node
    # (vLLM's usage: reclaimable cached blocks count as free); decode nodes: running KV;
    # prefill and collocated nodes with a host tier: GPU cache occupancy.
    "kv_utilization_by_node",
    "host_utilization_by_node",  # node -> host KV utilization
    "inflight",  # node -> calls queued or running there
    "kv_inflight_tokens",  # KV tokens held by running calls on that node
    "chunk_tokens",  # the chunked-prefill budget S per iteration
    "prefill_s_per_token",  # per-token prefill cost of the node's profile (c1)
    "prefill_base_s",  # per-iteration prefill overhead (c0)
    "prefill_s_per_pair",  # per query-key pair cost of prefill attention (c2)
)

_SIGNALS_ALLOWED = ", ".join(SIGNAL_FIELDS)


class Signals:
    """s(t): deployable system signals, read-only (see module docstring)."""

    __slots__ = SIGNAL_FIELDS

    def __init__(
        self,
        now: float,
        node: int | None,
        kv_utilization_by_node: Mapping[int, float],
        host_utilization_by_node: Mapping[int, float],
        inflight: Mapping[int, int],
        kv_inflight_tokens: int,
        chunk_tokens: int,
        prefill_s_per_token: float,
        prefill_base_s: float,
        prefill_s_per_pair: float = 0.0,
    ) -> None:
        w = object.__setattr__
        w(self, "now", now)
        w(self, "node", node)
        w(self, "kv_utilization_by_node", MappingProxyType(dict(kv_utilization_by_node)))
        w(self, "host_utilization_by_node", MappingProxyType(dict(host_utilization_by_node)))
        w(self, "kv_utilization", None if node is None else kv_utilization_by_node.get(node))
        w(self, "inflight", MappingProxyType(dict(inflight)))
        w(self, "kv_inflight_tokens", kv_inflight_tokens)
        w(self, "chunk_tokens", chunk_tokens)
        w(self, "prefill_s_per_token", prefill_s_per_token)
        w(self, "prefill_base_s", prefill_base_s)
        w(self, "prefill_s_per_pair", prefill_s_per_pair)

    def __getattr__(self, name: str) -> Any:
        raise PolicyError(f"no system signal {name!r}; signals are: {_SIGNALS_ALLOWED}")

    def __setattr__(self, name: str, value: object) -> None:
        raise PolicyError(f"signals are read-only (tried to set {name!r})")

    def __repr__(self) -> str:
        return (
            f"Signals(now={self.now:.3f}, node={self.node}, kv_utilization={self.kv_utilization})"
        )
