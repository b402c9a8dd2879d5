"""The Retention Plane's policies (paper 003 §3.4, Eq. 5-6, App. E).

At a call's completion a retention policy returns a decision for the program's KV state:
`protect(until, value)` (deadline d and value v), `RELEASE` (no protection: an ordinary
cache entry, LRU by last access) or `EVICT` (discard it now; the next call recomputes), or
None (no change). `on_turn_arrival` is asked when the successor call is released (the tool
gap is over and its length is now known) and returns the same kinds. Under pressure the
memory manager reclaims blocks in ascending (1[t < d], v): expired entries first, then
lower values; protection is a preference, not a lock. A value of None means "last access".

Shipped policies (registry `RETENTION_POLICIES`):
- `evict-always`: discard at completion (request-scoped KV lifetime).
- `lru`: release at completion; v = last access (cache-LRU).
- `ttl`: d = c + tau (fixed TTL; tau = 2 s as Continuum measures).
- `per-tool-ttl`: d = c + Q_alpha(G | tool), the alpha = 0.9 quantile of the gaps observed
  for the tool just requested (default 2 s before any observation) - Continuum.
- `pressure-ttl`: d = c + tau g(u), g(u) = 1 - 0.5 m(u), m(u) = clip((u - 0.7) / 0.2, 0, 1)
  with u the KV utilization at completion (SAGA, App. E Eq. 9).
- `min-waste`: InferCept's retain-or-discard test (App. E): retain until the predicted gap
  if g_hat n <= W_discard(n), else discard; no value is set. The forward-pass time
  t(n) = (a n + c) / 1000 s takes (a, c, S) as parameters, else linearizes the node's
  profile (a = c1 + c2 n / 2, c = c0: attention dominates re-prefilling long contexts).
- `branch-count`: paper 000's branch-aware eviction in this interface: protect (d = inf)
  while the call's branch is active, release when it finishes.

Policies read only the PCB, `now` and `self.signals` (see `cluster.policies.pcb`); they
keep their own statistics (observed gaps) but never mutate program or cluster state.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from typing import Any, Literal, NamedTuple, Protocol, cast

from cluster.core import ConfigError, Registry
from cluster.policies.errors import PolicyError
from cluster.policies.pcb import ProgramControlBlock, Signals

RetentionKind = Literal["protect", "release", "evict"]


class RetentionDecision(NamedTuple):
    """(v_{p,k}, d_{p,k}) of Eq. 1 as a decision; `until` and `value` only for protect."""

    kind: RetentionKind
    until: float | None = None
    value: float | None = None


RELEASE = RetentionDecision("release")
EVICT = RetentionDecision("evict")


def protect(until: float, value: float | None = None) -> RetentionDecision:
    """Protect the program's KV until `until` (simulated seconds) with value `value`."""
    return RetentionDecision("protect", float(until), None if value is None else float(value))


def normalize_decision(result: Any, policy: str, hook: str) -> RetentionDecision | None:
    """Accept a RetentionDecision, None/"none", "release", "evict", ("protect", until[, value])
    (the tuple form of paper 003's listings); anything else is a PolicyError."""
    if result is None or isinstance(result, RetentionDecision):
        if isinstance(result, RetentionDecision) and result.kind == "protect":
            _check_time(result.until, policy, hook)
        return result
    if isinstance(result, str):
        if result == "none":
            return None
        if result == "release":
            return RELEASE
        if result == "evict":
            return EVICT
    if isinstance(result, tuple) and result and result[0] == "protect" and 2 <= len(result) <= 3:
        until = result[1]
        value = result[2] if len(result) == 3 else None
        _check_time(until, policy, hook)
        if value is not None and not _is_number(value):
            raise PolicyError(f"retention policy {policy!r}.{hook}: value must be a number")
        return protect(until, value)
    raise PolicyError(
        f"retention policy {policy!r}.{hook} returned {result!r}; allowed: protect(until, value), "
        "RELEASE, EVICT, None, or the strings 'release'/'evict'/'none', or ('protect', until[, value])"
    )


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and not math.isnan(x)


def _check_time(until: Any, policy: str, hook: str) -> None:
    if not _is_number(until):
        raise PolicyError(
            f"retention policy {policy!r}.{hook}: protect deadline must be a number of "
            f"simulated seconds (math.inf allowed), got {until!r}"
        )


class RetentionHooks(Protocol):
    """What the plane calls (paper 003 App. E). `signals` is set before each call."""

    name: str
    signals: Signals

    def on_turn_complete(
        self, pcb: ProgramControlBlock, now: float
    ) -> RetentionDecision | None: ...

    def on_turn_arrival(self, pcb: ProgramControlBlock, now: float) -> RetentionDecision | None: ...


class RetentionPolicy:
    """Base class for retention policies: subclass it and implement the hooks.

    `on_turn_complete(pcb, now)` (or the listing form `(pcb, request_id, now)`) decides at
    completion - every retention policy defines it; `on_turn_arrival(pcb, now)` at the
    successor's release (default: no change). `self.signals` holds the system signals at
    the call (KV utilization of the node, in-flight calls, ...), set by the plane.
    """

    name = "custom"
    uses_signals = True
    signals: Signals = cast(Signals, None)  # set by the plane before each hook

    def on_turn_arrival(self, pcb: ProgramControlBlock, now: float) -> Any:
        return None


RETENTION_POLICIES: Registry[RetentionHooks] = Registry("retention policy")


@RETENTION_POLICIES.register("evict-always")
class EvictAlways(RetentionPolicy):
    name = "evict-always"
    uses_signals = False

    def on_turn_complete(self, pcb: ProgramControlBlock, now: float) -> RetentionDecision:
        return EVICT


@RETENTION_POLICIES.register("lru")
class LRURetention(RetentionPolicy):
    name = "lru"
    uses_signals = False

    def on_turn_complete(self, pcb: ProgramControlBlock, now: float) -> RetentionDecision:
        return RELEASE


def _positive(name: str, value: float) -> float:
    if not _is_number(value) or value < 0:
        raise ConfigError(f"retention parameter {name!r} must be a number >= 0, got {value!r}")
    return float(value)


@RETENTION_POLICIES.register("ttl")
class FixedTTL(RetentionPolicy):
    """d = c + tau; protection ends when the successor arrives (its call pins the KV)."""

    name = "ttl"
    uses_signals = False

    def __init__(self, tau_s: float = 2.0) -> None:
        self.tau_s = _positive("tau_s", tau_s)

    def on_turn_complete(self, pcb: ProgramControlBlock, now: float) -> RetentionDecision:
        return protect(now + self.tau_s)

    def on_turn_arrival(self, pcb: ProgramControlBlock, now: float) -> RetentionDecision:
        return RELEASE


class GapQuantiles:
    """Observed tool gaps per tool (a sliding window) and their empirical quantiles."""

    def __init__(self, window: int = 2048) -> None:
        if window < 1:
            raise ConfigError(f"gap window must be >= 1, got {window}")
        self.window = window
        self._fifo: dict[str | None, deque[float]] = {}
        self._sorted: dict[str | None, list[float]] = {}

    def observe(self, tool: str | None, gap_s: float) -> None:
        fifo = self._fifo.setdefault(tool, deque())
        srt = self._sorted.setdefault(tool, [])
        fifo.append(gap_s)
        bisect.insort(srt, gap_s)
        if len(fifo) > self.window:
            old = fifo.popleft()
            del srt[bisect.bisect_left(srt, old)]

    def quantile(self, tool: str | None, q: float) -> float | None:
        srt = self._sorted.get(tool)
        if not srt:
            return None
        # The lower empirical quantile: a gap that was actually observed.
        return srt[min(len(srt) - 1, max(0, math.ceil(q * len(srt)) - 1))]


@RETENTION_POLICIES.register("per-tool-ttl")
class PerToolTTL(RetentionPolicy):
    """d = c + Q_q(G | tool) over the gaps observed so far for the requested tool."""

    name = "per-tool-ttl"
    uses_signals = False

    def __init__(self, quantile: float = 0.9, default_s: float = 2.0, window: int = 2048) -> None:
        if not 0 < quantile <= 1:
            raise ConfigError(f"retention parameter 'quantile' must lie in (0, 1], got {quantile}")
        self.quantile = float(quantile)
        self.default_s = _positive("default_s", default_s)
        self.gaps = GapQuantiles(window)

    def on_turn_complete(self, pcb: ProgramControlBlock, now: float) -> RetentionDecision:
        q = self.gaps.quantile(pcb.tool_name, self.quantile)
        return protect(now + (self.default_s if q is None else q))

    def on_turn_arrival(self, pcb: ProgramControlBlock, now: float) -> RetentionDecision:
        gap = pcb.gap_elapsed_s(now)
        if gap is not None:
            self.gaps.observe(pcb.tool_name, gap)
        return RELEASE


def pressure_factor(
    u: float | None, low: float = 0.7, high: float = 0.9, floor: float = 0.5
) -> float:
    """g(u) = 1 - (1 - floor) m(u), m(u) = clip((u - low) / (high - low), 0, 1) (App. E Eq. 9)."""
    if u is None:
        return 1.0
    m = min(1.0, max(0.0, (u - low) / (high - low)))
    return 1.0 - (1.0 - floor) * m


@RETENTION_POLICIES.register("pressure-ttl")
class PressureTTL(RetentionPolicy):
    """d = c + tau g(u(c)): full tau below 70% KV utilization, tau/2 above 90%."""

    name = "pressure-ttl"

    def __init__(
        self, tau_s: float = 2.0, u_low: float = 0.7, u_high: float = 0.9, floor: float = 0.5
    ) -> None:
        self.tau_s = _positive("tau_s", tau_s)
        if not 0 <= u_low < u_high <= 1:
            raise ConfigError(f"need 0 <= u_low < u_high <= 1, got {u_low}, {u_high}")
        if not 0 <= floor <= 1:
            raise ConfigError(f"retention parameter 'floor' must lie in [0, 1], got {floor}")
        self.u_low, self.u_high, self.floor = float(u_low), float(u_high), float(floor)

    def on_turn_complete(self, pcb: ProgramControlBlock, now: float) -> RetentionDecision:
        u = self.signals.kv_utilization if self.signals is not None else None
        return protect(now + self.tau_s * pressure_factor(u, self.u_low, self.u_high, self.floor))

    def on_turn_arrival(self, pcb: ProgramControlBlock, now: float) -> RetentionDecision:
        return RELEASE


def discard_waste(
    n_tokens: int,
    chunk_tokens: int,
    inflight_calls: int,
    inflight_kv_tokens: int,
    a_ms: float,
    c_ms: float,
) -> float:
    """W_discard(n) (InferCept Eq. 4 as paper 003 App. E states it), in token-seconds.

    Re-prefilling n context tokens at the next call takes ceil(n / c_h) forward passes of
    c_h = max(S - n_inflight, 1) tokens (the running calls' decode tokens share the chunk
    budget S), each t(c_h) = (a c_h + c) / 1000 s. Waste: during pass i the i c_h tokens
    recomputed so far sit in memory (sum_i t(c_h) min(i c_h, n)), and each pass slows the
    running batch by a c_h / 1000 s while its KV (inflight_kv_tokens) is held.
    """
    if n_tokens <= 0:
        return 0.0
    c_h = max(chunk_tokens - inflight_calls, 1)
    passes = math.ceil(n_tokens / c_h)
    t_pass = (a_ms * c_h + c_ms) / 1000.0
    full = passes - 1  # passes before the last hold i * c_h tokens; the last holds n
    own = t_pass * (c_h * full * (full + 1) / 2.0 + n_tokens)
    slowdown = passes * (a_ms * c_h / 1000.0) * inflight_kv_tokens
    return own + slowdown


@RETENTION_POLICIES.register("min-waste")
class MinWaste(RetentionPolicy):
    """Retain (d = c + g_hat) iff g_hat n <= W_discard(n), else discard (InferCept)."""

    name = "min-waste"

    def __init__(
        self,
        quantile: float = 0.9,
        default_gap_s: float = 1.0,
        a_ms_per_token: float | None = None,
        c_ms: float | None = None,
        chunk_tokens: int | None = None,
        window: int = 2048,
    ) -> None:
        if not 0 < quantile <= 1:
            raise ConfigError(f"retention parameter 'quantile' must lie in (0, 1], got {quantile}")
        self.quantile = float(quantile)
        self.default_gap_s = _positive("default_gap_s", default_gap_s)
        # Per-device profile (a, c, S); None takes the node's profile from the signals.
        self.a_ms = a_ms_per_token
        self.c_ms = c_ms
        self.chunk_tokens = chunk_tokens
        self.gaps = GapQuantiles(window)

    def predicted_gap(self, pcb: ProgramControlBlock) -> float:
        q = self.gaps.quantile(pcb.tool_name, self.quantile)
        return self.default_gap_s if q is None else q

    def on_turn_complete(self, pcb: ProgramControlBlock, now: float) -> RetentionDecision:
        s = self.signals
        n = pcb.context_tokens
        # Without a per-device (a, c), linearize the node's prefill cost around the
        # recompute: per token c1 plus attention c2 over the n / 2 tokens before it.
        a = (
            self.a_ms
            if self.a_ms is not None
            else ((s.prefill_s_per_token + s.prefill_s_per_pair * n / 2.0) * 1e3 if s else 0.05)
        )
        c = self.c_ms if self.c_ms is not None else (s.prefill_base_s * 1e3 if s else 30.0)
        chunk = self.chunk_tokens or (s.chunk_tokens if s else 8192)
        node = s.node if s else None
        calls = s.inflight.get(node, 0) if s is not None and node is not None else 0
        kv = s.kv_inflight_tokens if s else 0
        g = self.predicted_gap(pcb)
        waste = discard_waste(n, chunk, calls, kv, a, c)
        if g * n <= waste:
            return protect(now + g)
        return EVICT

    def on_turn_arrival(self, pcb: ProgramControlBlock, now: float) -> RetentionDecision:
        gap = pcb.gap_elapsed_s(now)
        if gap is not None:
            self.gaps.observe(pcb.tool_name, gap)
        return RELEASE


@RETENTION_POLICIES.register("branch-count")
class BranchCountRetention(RetentionPolicy):
    """Paper 000's branch-aware eviction as a retention policy: the completed call's KV is
    protected indefinitely while its branch is active and released when the branch ends."""

    name = "branch-count"
    uses_signals = False

    def on_turn_complete(self, pcb: ProgramControlBlock, now: float) -> RetentionDecision:
        return protect(math.inf) if pcb.branch_ids else RELEASE
