"""What the control plane knows about nodes: reports, pending requests, the read-only view.

Engines report their state at every iteration launch (paper 000 App. E.3); the router uses
a report only if it is at most `max_report_age_s` (5 s) old, and adds the requests it sent to
a node after that node's last report. Policies read a `ClusterView` and return decisions;
they never mutate it.

The router prices every prefill node at every decision, so `ClusterState` keeps two memos:
each node's prefill pricer (its model's constants or its predictor, bound once) and the
prices of the requests sent to it since its last report (W_n's last part). Once the
router has priced, only `ClusterState` methods change `sent`, `models` and
`prefill_predictors`, each dropping the memos it makes stale, so a memoized W_n is the
from-scratch sum, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial, reduce
from itertools import islice
from operator import add
from typing import NamedTuple

from cluster.core import BlockHash, Phase
from cluster.kv.directory import KVDirectory
from models import FetchModel, NodeModel, RequestWork

# A node's prefill time for a request, (node model, t_uc, t_c) -> seconds, priced some other
# way than Eq. 3 (the router's and the queue estimates' default).
PrefillPredictor = Callable[[NodeModel, float, float], float]
# One node's prefill time, (t_uc, t_c) -> seconds: its predictor or Eq. 3 bound to its model.
Pricer = Callable[[float, float], float]


def eq3_pricer(model: NodeModel) -> Pricer:
    """Eq. 3 for `model` with its constants bound (the same floats as computing it from the
    model each call: c3 * f is the left operand there too)."""
    p = model.prefill
    c0, c1, c2, c3f = p.c0, p.c1, p.c2, p.c3 * model.restore_fraction
    t_bar = model.mean_new_tokens

    def eq3(t_uc: float, t_c: float) -> float:
        # max(t, 0.0) without the call: 0.0 only where 0.0 > t (so a NaN stays, as in max)
        t_uc = 0.0 if t_uc < 0.0 else t_uc
        t_c = 0.0 if t_c < 0.0 else t_c
        a = t_uc * t_c + t_uc * (t_uc + 1.0) / 2.0
        return c0 * t_uc / t_bar + c1 * t_uc + c2 * a + c3f * t_c

    if not model.prefill_overhead:
        return eq3

    def eq3_overhead(t_uc: float, t_c: float) -> float:
        # the passes' CPU overhead a live engine spends around the forwards (Eq. 3's term)
        return eq3(t_uc, t_c) + model.prefill_overhead_s(max(t_uc, 0.0))

    return eq3_overhead


def form_prefill_time(model: NodeModel, t_uc: float, t_c: float) -> float:
    """The node's fitted prefill form (models.forms) for one request: Eq. 3 plus the form's
    extra terms (the floor's knee, c4 per cached token read, c5 for the experts touched),
    as the planner prices it (NodeModel.prefill_request_time). Equal to Eq. 3 for a node on
    the paper form."""
    return model.prefill_request_time(RequestWork(max(t_uc, 0.0), max(t_c, 0.0)))


class QueuedWork(NamedTuple):
    """Prefill work of one queued (or sent) request as the router estimated it."""

    request_id: str
    t_uc: float
    t_c: float


@dataclass(frozen=True, slots=True)
class NodeReport:
    """A node's state at time `t` (an iteration launch)."""

    node_id: int
    t: float
    phase: Phase
    queued: tuple[QueuedWork, ...] = ()  # prefill queue, in order
    remaining_s: float = 0.0  # T_rem: remaining time of the running prefill batch
    running: int = 0  # requests running (prefill batch or decode batch)
    # Request ids the node had received by `t`; None means every request sent up to `t`
    # has arrived (the simulator's engines receive instantly).
    seen: frozenset[str] | None = None
    kv_gpu_used: int = 0
    kv_gpu_capacity: int = 0
    kv_host_used: int = 0
    kv_host_capacity: int = 0


class RouteRequest(NamedTuple):
    """What the router knows about a request: never its output length."""

    request_id: str
    program_id: str
    branch_id: str
    path: Sequence[BlockHash]  # full-page block hashes of its input
    t_in: int  # input tokens
    now: float


class RouteDecision(NamedTuple):
    node_id: int
    policy: str
    predicted_ttft_s: float | None
    cached_tokens: int  # prefix the node holds itself
    fetch_tokens: int  # prefix it must fetch from another node's host memory (x_n)


@dataclass(slots=True)
class ClusterState:
    """Mutable state the control plane maintains; policies see it through `ClusterView`."""

    phases: dict[int, Phase]
    models: dict[int, NodeModel]
    directory: KVDirectory
    fetch: FetchModel = field(default_factory=FetchModel)
    copy_price_s_per_token: float = 0.0
    kv_fetch: str = "async"  # "async" | "sync" | "none"
    max_report_age_s: float = 5.0
    reports: dict[int, NodeReport] = field(default_factory=dict)
    # node -> request id -> (sent time, work) for requests not yet seen in a report
    sent: dict[int, dict[str, tuple[float, QueuedWork]]] = field(default_factory=dict)
    unavailable: set[int] = field(default_factory=set)  # switching or relaunching nodes
    decode_load: dict[int, int] = field(default_factory=dict)  # bound, unfinished requests
    queue_memo: dict[int, tuple[NodeReport, float]] = field(default_factory=dict)
    # A request's expected serving overheads before its first token (models.overheads),
    # added to the router's predicted TTFT; 0 for the simulator without overheads.
    overhead_s: float = 0.0
    # node -> its prefill predictor; nodes without one are priced with Eq. 3
    prefill_predictors: dict[int, PrefillPredictor] = field(default_factory=dict)
    # Memos (see the module docstring): node -> its pricer; node -> the prices of the first
    # len(list) requests of sent[node], in sent order (extended lazily by `sent_prices`).
    pricers: dict[int, Pricer] = field(default_factory=dict)
    sent_price_memo: dict[int, list[float]] = field(default_factory=dict)

    def nodes_in(self, phase: Phase) -> list[int]:
        return sorted(n for n, p in self.phases.items() if p == phase and n not in self.unavailable)

    def report(self, r: NodeReport) -> None:
        self.reports[r.node_id] = r
        sent = self.sent.get(r.node_id)
        if sent:
            if r.seen is None:
                gone = [rid for rid, (ts, _) in sent.items() if ts <= r.t]
            else:
                # A request missing from reports for a minute is presumed lost or finished.
                gone = [rid for rid, (ts, _) in sent.items() if rid in r.seen or ts < r.t - 60.0]
            for rid in gone:
                del sent[rid]
            if gone:
                self.sent_price_memo.pop(r.node_id, None)

    def set_prefill_predictor(self, node: int, predictor: PrefillPredictor | None) -> None:
        """Price `node`'s prefill with `predictor` (None: Eq. 3); its memoized queue
        estimate was priced the old way."""
        if predictor is None:
            self.prefill_predictors.pop(node, None)
        else:
            self.prefill_predictors[node] = predictor
        self._repriced(node)

    def set_models(self, models: Mapping[int, NodeModel]) -> None:
        """Replace the models of the nodes in `models` (the others keep theirs); their
        queues, and what was sent to them, are priced with the new models from now on."""
        self.models.update(models)
        for n in models:
            self._repriced(n)

    def _repriced(self, node: int) -> None:
        self.pricers.pop(node, None)
        self.sent_price_memo.pop(node, None)
        self.queue_memo.pop(node, None)

    def record_sent(self, node: int, work: QueuedWork, t: float) -> None:
        sent = self.sent.setdefault(node, {})
        if work.request_id in sent:  # sent again: its entry changes where it stands
            self.sent_price_memo.pop(node, None)
        sent[work.request_id] = (t, work)

    def release_sent(self, node: int, request_id: str) -> None:
        """The request no longer counts as sent to `node` (it will not run there)."""
        sent = self.sent.get(node)
        if sent is not None and sent.pop(request_id, None) is not None:
            self.sent_price_memo.pop(node, None)

    def pricer(self, node: int) -> Pricer:
        """`node`'s prefill time (t_uc, t_c) -> seconds: its predictor, else Eq. 3."""
        got = self.pricers.get(node)
        if got is None:
            model = self.models[node]
            predictor = self.prefill_predictors.get(node)
            got = eq3_pricer(model) if predictor is None else partial(predictor, model)
            self.pricers[node] = got
        return got

    def sent_prices(self, node: int) -> list[float]:
        """The prefill time of each request in sent[node], in sent order (memoized; read-only
        for callers)."""
        sent = self.sent.get(node)
        if not sent:
            return []
        prices = self.sent_price_memo.get(node)
        if prices is None:
            prices = self.sent_price_memo[node] = []
        if len(prices) < len(sent):
            price = self.pricer(node)
            prices.extend(price(q.t_uc, q.t_c) for _, q in islice(sent.values(), len(prices), None))
        return prices

    def fresh_report(self, node: int, now: float) -> NodeReport | None:
        r = self.reports.get(node)
        if r is None or now - r.t > self.max_report_age_s:
            return None
        return r

    def pending(self, node: int) -> list[QueuedWork]:
        return [w for _, w in self.sent.get(node, {}).values()]


class ClusterView:
    """Read-only access to `ClusterState` for policies."""

    __slots__ = ("_s",)

    def __init__(self, state: ClusterState) -> None:
        self._s = state

    @property
    def directory(self) -> KVDirectory:
        return self._s.directory

    @property
    def fetch(self) -> FetchModel:
        return self._s.fetch

    @property
    def copy_price_s_per_token(self) -> float:
        return self._s.copy_price_s_per_token

    @property
    def kv_fetch(self) -> str:
        return self._s.kv_fetch

    @property
    def overhead_s(self) -> float:
        """A request's expected serving overheads before its first token (s)."""
        return self._s.overhead_s

    @property
    def phases(self) -> Mapping[int, Phase]:
        return self._s.phases

    def nodes_in(self, phase: Phase) -> list[int]:
        return self._s.nodes_in(phase)

    def model(self, node: int) -> NodeModel:
        return self._s.models[node]

    def fresh_report(self, node: int, now: float) -> NodeReport | None:
        return self._s.fresh_report(node, now)

    def pending(self, node: int) -> list[QueuedWork]:
        return self._s.pending(node)

    def queued_time(self, node: int, report: NodeReport) -> float:
        """Sum of Eq. 3 over a report's queue (memoized per report)."""
        s = self._s
        got = s.queue_memo.get(node)
        if got is not None and got[0] is report:
            return got[1]
        price = s.pricer(node)
        total = sum(price(q.t_uc, q.t_c) for q in report.queued)
        s.queue_memo[node] = (report, total)
        return total

    def prefill_wait(self, node: int, now: float) -> float:
        """W_n at `now`: the remaining time of the node's running batch per its fresh report,
        plus Eq. 3 over the report's queue, plus Eq. 3 over the requests sent since (in the
        order they were sent)."""
        s = self._s
        wait = 0.0
        r = s.fresh_report(node, now)
        if r is not None:
            wait = max(0.0, r.remaining_s - (now - r.t)) + self.queued_time(node, r)
        if s.sent.get(node):
            # A left fold, as `wait += price` per request adds (not sum(): from Python 3.12
            # a sum of floats is compensated, another float).
            wait = reduce(add, s.sent_prices(node), wait)
        return wait

    def decode_load(self, node: int) -> int:
        return self._s.decode_load.get(node, 0)

    def outstanding(self, node: int, now: float) -> int:
        """Requests queued or running on the node per its fresh report, plus pending ones."""
        r = self.fresh_report(node, now)
        base = 0 if r is None else len(r.queued) + r.running
        return base + len(self._s.sent.get(node, {}))

    def prefill_time(self, node: int, t_uc: float, t_c: float) -> float:
        """Eq. 3 for a request with t_uc uncached and t_c cached tokens on `node`, or the
        node's prefill predictor where it has one."""
        s = self._s
        price = s.pricers.get(node)
        if price is None:
            price = s.pricer(node)
        return price(t_uc, t_c)

    def pricer(self, node: int) -> Pricer:
        """`prefill_time` of `node` as a function of (t_uc, t_c), for pricing many requests."""
        return self._s.pricer(node)
