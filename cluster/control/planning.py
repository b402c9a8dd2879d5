"""Phase-split planners behind one protocol (paper 000 §5.2, Alg. E.3 outer loop; SPEC §4).

- `gain`: at the end of each window (T_win = 600 s, m = 10 slices) evaluate every prefill
  count p != |P| as the split that changes the fewest nodes, with Theta (Eq. 5) on each
  slice's mean work w_bar_i and decode load q_bar_i, the gain test (Eq. 6), and t_bar_n, f_n
  remeasured over the window; skip while a node drains and for 120 s after a switch; switch
  to the qualified candidate with the largest mean gain.

  q_bar counts the requests in service (queued for prefill, prefilling, in transfer or
  decoding), not only those decoding: by Little's law the decode term of Eq. 5 evaluated at
  the measured decoding count equals the current throughput, so with the literal count no
  candidate with more prefill nodes could ever gain, even when prefill is the bottleneck
  (the OSWorld period of paper 000 §6.3, where the planner moves to 8P1D). Requests waiting
  for prefill are decode demand that prefill holds back; when decode is the bottleneck the
  prefill queue is short and the two counts agree.
- `static`: never switches.
- `dynamo`: Dynamo-like thresholds on prefill queue depth per prefill node and decode KV
  utilization, +-1 node per adjustment interval; the backend relaunches the node (out of
  service for the relaunch time, its KV lost).
- `arrow`: Arrow-like: each window predicts TTFT from the full input length (cached prefix
  counted as work) and decode TPOT, moves one node toward the phase missing its target;
  switches in place but strands the node's KV.
Every evaluation returns all candidates with mean gain, std and the qualified flag.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, Protocol

import numpy as np

from cluster.control.bounds import check_window
from cluster.core import Phase, Registry
from models import CandidateGain, MeanWork, NodeModel, cluster_throughput, gain_test
from models.gain import choose

SwitchMode = Literal["in-place", "relaunch", "strand"]


class Switch(NamedTuple):
    node_id: int
    to_phase: Phase


class PlannerDecision(NamedTuple):
    """One evaluation: every candidate (for `planner_windows`) and the switches to apply."""

    t: float
    current_prefill: int
    candidates: tuple[CandidateGain, ...]
    chosen_prefill: int | None
    switches: tuple[Switch, ...]
    mode: SwitchMode = "in-place"
    reason: str = ""


class WindowStats:
    """Per-request work, decode load and per-node prefill iterations over recent time.

    Request work is recorded at completion (t_out is known only then); the decode load q is
    a step function integrated over time; t_bar_n and f_n come from each node's prefill
    iterations.
    """

    def __init__(self, horizon_s: float = 3600.0) -> None:
        self.horizon_s = horizon_s
        self._req_t: list[float] = []
        self._req: list[tuple[float, float, float, float, float]] = []  # t_uc, A, t_c, t_out, t_acc
        self._q_t: list[float] = [0.0]
        self._q: list[float] = [0.0]
        # node -> [(t, new_tokens, cached_tokens, restored_tokens)]
        self._iters: dict[int, list[tuple[float, float, float, float]]] = {}

    def record_request(
        self, t: float, t_uc: float, attn_pairs: float, t_c: float, t_out: float, t_acc: float
    ) -> None:
        self._req_t.append(t)
        self._req.append((t_uc, attn_pairs, t_c, t_out, t_acc))

    def record_decode_load(self, t: float, q: float) -> None:
        """The decode demand q at time t (a step function; see the module docstring)."""
        if t < self._q_t[-1]:
            t = self._q_t[-1]
        if t == self._q_t[-1]:
            self._q[-1] = q
        else:
            self._q_t.append(t)
            self._q.append(q)

    def record_prefill_iteration(
        self, node: int, t: float, new_tokens: float, cached: float, restored: float
    ) -> None:
        self._iters.setdefault(node, []).append((t, new_tokens, cached, restored))

    def prune(self, now: float) -> None:
        cut = now - self.horizon_s
        i = bisect.bisect_left(self._req_t, cut)
        if i > 1000:
            del self._req_t[:i], self._req[:i]
        j = bisect.bisect_left(self._q_t, cut) - 1
        if j > 1000:
            del self._q_t[:j], self._q[:j]
        for it in self._iters.values():
            k = bisect.bisect_left(it, (cut,))
            if k > 1000:
                del it[:k]

    def mean_load(self, t0: float, t1: float) -> float:
        """Time average of q over [t0, t1)."""
        if t1 <= t0:
            return self._q[-1]
        ts, qs = self._q_t, self._q
        i = max(bisect.bisect_right(ts, t0) - 1, 0)
        total = 0.0
        t = t0
        while i < len(ts) and t < t1:
            end = ts[i + 1] if i + 1 < len(ts) else t1
            end = min(end, t1)
            if end > t:
                total += qs[i] * (end - t)
                t = end
            i += 1
        return total / (t1 - t0)

    def mean_work(self, t0: float, t1: float) -> tuple[MeanWork, int] | None:
        i, j = bisect.bisect_left(self._req_t, t0), bisect.bisect_left(self._req_t, t1)
        if j <= i:
            return None
        arr = np.asarray(self._req[i:j], dtype=np.float64)
        m = arr.mean(axis=0)
        return MeanWork(
            t_uc=m[0], attn_pairs=m[1], t_c=m[2], t_out=m[3], t_acc=max(m[4], 1e-9)
        ), j - i

    def slices(self, t_end: float, window_s: float, m: int) -> list[tuple[MeanWork, float]]:
        """(w_bar_i, q_bar_i) of each slice with completed requests."""
        out: list[tuple[MeanWork, float]] = []
        width = window_s / m
        for k in range(m):
            t0 = t_end - window_s + k * width
            t1 = t0 + width
            got = self.mean_work(t0, t1)
            if got is not None:
                out.append((got[0], self.mean_load(t0, t1)))
        return out

    def remeasure(self, node: int, t0: float, t1: float) -> tuple[float, float] | None:
        """(t_bar_n, f_n) over [t0, t1): mean new tokens per iteration, restored / cached."""
        it = self._iters.get(node)
        if not it:
            return None
        i, j = bisect.bisect_left(it, (t0,)), bisect.bisect_left(it, (t1,))
        if j <= i:
            return None
        arr = np.asarray([x[1:] for x in it[i:j]], dtype=np.float64)
        t_bar = float(arr[:, 0].mean())
        cached = float(arr[:, 1].sum())
        f = float(arr[:, 2].sum() / cached) if cached > 0 else 0.0
        return max(t_bar, 1.0), min(max(f, 0.0), 1.0)


@dataclass(slots=True)
class PlannerView:
    """What a planner may read (filled by the control plane)."""

    now: float
    phases: Mapping[int, Phase]
    models: Mapping[int, NodeModel]
    stats: WindowStats
    draining: bool = False
    last_switch_t: float | None = None
    unavailable: frozenset[int] = frozenset()
    prefill_queue: Mapping[int, int] = field(default_factory=dict)  # queued requests per node
    decode_running: Mapping[int, int] = field(default_factory=dict)  # running requests per node
    kv_utilization: Mapping[int, float] = field(default_factory=dict)  # GPU KV used / capacity
    queued_full_input: Mapping[int, Sequence[float]] = field(default_factory=dict)  # t_in of queued

    def split(self) -> tuple[list[int], list[int]]:
        p = sorted(
            n for n, ph in self.phases.items() if ph == "prefill" and n not in self.unavailable
        )
        d = sorted(
            n for n, ph in self.phases.items() if ph == "decode" and n not in self.unavailable
        )
        return p, d


class Planner(Protocol):
    name: str
    interval_s: float  # how often `step` wants to run

    def step(self, view: PlannerView) -> PlannerDecision | None:
        """Evaluate at view.now; None when skipped (cooldown, draining, no data)."""
        ...


PLANNERS: Registry[Planner] = Registry("planner")


def candidate_split(
    prefill: Sequence[int], decode: Sequence[int], p: int, view: PlannerView
) -> tuple[list[int], list[int], tuple[Switch, ...]]:
    """The split with p prefill nodes that changes the fewest nodes.

    Moves the decode nodes with the fewest running requests (quickest to drain) or the
    prefill nodes with the shortest queues.
    """
    P, D = list(prefill), list(decode)
    moves: list[Switch] = []
    if p > len(P):
        pick = sorted(D, key=lambda n: (view.decode_running.get(n, 0), n))[: p - len(P)]
        for n in pick:
            D.remove(n)
            P.append(n)
            moves.append(Switch(n, "prefill"))
    elif p < len(P):
        pick = sorted(P, key=lambda n: (view.prefill_queue.get(n, 0), n))[: len(P) - p]
        for n in pick:
            P.remove(n)
            D.append(n)
            moves.append(Switch(n, "decode"))
    return sorted(P), sorted(D), tuple(moves)


@PLANNERS.register("gain")  # type: ignore[arg-type]
class GainPlanner:
    name = "gain"

    def __init__(
        self, window_s: float = 600.0, slices: int = 10, cooldown_s: float = 120.0
    ) -> None:
        check_window(window_s, slices)
        self.window_s = window_s
        self.slices = slices
        self.cooldown_s = cooldown_s

    @property
    def interval_s(self) -> float:
        return self.window_s

    def _remeasured(self, view: PlannerView, prefill: Sequence[int]) -> dict[int, NodeModel]:
        t0, t1 = view.now - self.window_s, view.now
        meas = {n: view.stats.remeasure(n, t0, t1) for n in prefill}
        known = [v for v in meas.values() if v is not None]
        default = (
            (float(np.mean([k[0] for k in known])), float(np.mean([k[1] for k in known])))
            if known
            else None
        )
        out: dict[int, NodeModel] = {}
        for n, model in view.models.items():
            got = meas.get(n) or default
            out[n] = model.remeasured(*got) if got is not None else model
        return out

    def evaluate(self, view: PlannerView) -> PlannerDecision | None:
        """The gain test for every candidate, ignoring cooldown (used by `step` and advise)."""
        prefill, decode = view.split()
        n_total = len(prefill) + len(decode)
        if n_total < 2:
            return None
        slices = view.stats.slices(view.now, self.window_s, self.slices)
        if len(slices) < 2:
            return None
        models = self._remeasured(view, prefill)
        current = [
            cluster_throughput([models[n] for n in prefill], [models[n] for n in decode], w, q)
            for w, q in slices
        ]
        cands: list[CandidateGain] = []
        splits: dict[int, tuple[Switch, ...]] = {}
        for p in range(1, n_total):
            if p == len(prefill):
                continue
            P, D, moves = candidate_split(prefill, decode, p, view)
            gains = [
                cluster_throughput([models[n] for n in P], [models[n] for n in D], w, q) - cur
                for (w, q), cur in zip(slices, current, strict=True)
            ]
            cands.append(gain_test(p, gains))
            splits[p] = moves
        best = choose(cands)
        return PlannerDecision(
            view.now,
            len(prefill),
            tuple(cands),
            None if best is None else best.prefill_count,
            () if best is None else splits[best.prefill_count],
            "in-place",
            "gain test",
        )

    def step(self, view: PlannerView) -> PlannerDecision | None:
        if view.draining:
            return None
        if view.last_switch_t is not None and view.now - view.last_switch_t < self.cooldown_s:
            return None
        return self.evaluate(view)


@PLANNERS.register("static")
class StaticPlanner:
    name = "static"
    interval_s = float("inf")

    def step(self, view: PlannerView) -> PlannerDecision | None:
        return None


@PLANNERS.register("dynamo")
class DynamoLikePlanner:
    """Dynamo-like load planner: queue-depth and KV-utilization thresholds, +-1 node, relaunch."""

    name = "dynamo"

    def __init__(
        self,
        interval_s: float = 180.0,
        prefill_queue_scale_up: float = 5.0,
        prefill_queue_scale_down: float = 0.2,
        decode_kv_scale_up: float = 0.9,
        decode_kv_scale_down: float = 0.5,
    ) -> None:
        self.interval_s = interval_s
        self.prefill_queue_scale_up = prefill_queue_scale_up
        self.prefill_queue_scale_down = prefill_queue_scale_down
        self.decode_kv_scale_up = decode_kv_scale_up
        self.decode_kv_scale_down = decode_kv_scale_down

    def step(self, view: PlannerView) -> PlannerDecision | None:
        if view.draining or view.unavailable:
            return None  # one relaunch at a time
        prefill, decode = view.split()
        if not prefill or not decode:
            return None
        queue = float(np.mean([view.prefill_queue.get(n, 0) for n in prefill]))
        kv = float(np.mean([view.kv_utilization.get(n, 0.0) for n in decode]))
        switches: tuple[Switch, ...] = ()
        reason = f"prefill queue {queue:.2f}/node, decode KV {kv:.2f}"
        if queue > self.prefill_queue_scale_up and kv < self.decode_kv_scale_up and len(decode) > 1:
            switches = candidate_split(prefill, decode, len(prefill) + 1, view)[2]
        elif (
            kv > self.decode_kv_scale_up
            and queue < self.prefill_queue_scale_up
            and len(prefill) > 1
        ) or (
            queue < self.prefill_queue_scale_down
            and kv > self.decode_kv_scale_down
            and len(prefill) > 1
        ):
            switches = candidate_split(prefill, decode, len(prefill) - 1, view)[2]
        chosen = len(prefill) + sum(1 if s.to_phase == "prefill" else -1 for s in switches)
        return PlannerDecision(
            view.now, len(prefill), (), chosen if switches else None, switches, "relaunch", reason
        )


@PLANNERS.register("arrow")
class ArrowLikePlanner:
    """Arrow-like SLO planner: TTFT from the full input length, TPOT from the decode batch."""

    name = "arrow"

    def __init__(
        self, interval_s: float = 60.0, ttft_slo_s: float = 5.0, tpot_slo_s: float = 0.05
    ) -> None:
        self.interval_s = interval_s
        self.ttft_slo_s = ttft_slo_s
        self.tpot_slo_s = tpot_slo_s

    def step(self, view: PlannerView) -> PlannerDecision | None:
        if view.draining:
            return None
        prefill, decode = view.split()
        if not prefill or not decode:
            return None
        ttft = 0.0
        for n in prefill:
            m = view.models[n]
            # Full input length as uncached work: the cached prefix counts as prefill work.
            wait = sum(
                m.prefill.iteration_time(t_in, t_in * (t_in + 1) / 2, 0)
                for t_in in view.queued_full_input.get(n, ())
            )
            ttft = max(ttft, wait)
        tpot = 0.0
        for n in decode:
            b = view.decode_running.get(n, 0)
            if b:
                tpot = max(tpot, view.models[n].decode.iteration_time(b))
        switches: tuple[Switch, ...] = ()
        if ttft > self.ttft_slo_s and tpot <= self.tpot_slo_s and len(decode) > 1:
            switches = candidate_split(prefill, decode, len(prefill) + 1, view)[2]
        elif tpot > self.tpot_slo_s and ttft <= self.ttft_slo_s and len(prefill) > 1:
            switches = candidate_split(prefill, decode, len(prefill) - 1, view)[2]
        chosen = len(prefill) + sum(1 if s.to_phase == "prefill" else -1 for s in switches)
        reason = f"predicted TTFT {ttft:.2f} s (full input), TPOT {tpot * 1e3:.1f} ms"
        return PlannerDecision(
            view.now, len(prefill), (), chosen if switches else None, switches, "strand", reason
        )
