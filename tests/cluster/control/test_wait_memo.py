"""The router's memoized pricing (ClusterState.pricer, sent_prices, queue_memo) gives the
floats a from-scratch W_n gives, bit for bit, after any interleaving of sends, re-sends,
reports (with and without `seen`), releases, model and predictor changes and time passing."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.control.state import (
    ClusterState,
    ClusterView,
    NodeReport,
    QueuedWork,
    eq3_pricer,
    form_prefill_time,
)
from cluster.kv.directory import KVDirectory
from models import DecodeModel, NodeModel, PrefillModel

NODES = (0, 1, 2)
DECODE = DecodeModel(0.012, 0.015, 2.8e-4)
MODELS = (
    NodeModel(PrefillModel(0.03, 8e-5, 4e-10, 3e-7), DECODE),
    NodeModel(PrefillModel(0.021, 6.1e-5, 3.3e-10, 2.9e-7), DECODE, 3000.0, 0.37),
    NodeModel(PrefillModel(0.05, 9e-5, 5e-10, 1e-7, knee_tokens=4096.0, c4=2e-8), DECODE, 700.0),
)


def scaled(model: NodeModel, t_uc: float, t_c: float) -> float:
    """A predictor other than the fitted form (a user's own)."""
    return 1.5 * form_prefill_time(model, t_uc, t_c) + 1e-3


PREDICTORS = (None, form_prefill_time, scaled)


def reference_price(s: ClusterState, node: int, t_uc: float, t_c: float) -> float:
    """Eq. 3 (or the node's predictor) computed from the model on every call, as the router
    priced prefill before the memos."""
    m = s.models[node]
    predictor = s.prefill_predictors.get(node)
    if predictor is not None:
        return predictor(m, t_uc, t_c)
    p = m.prefill
    t_uc = max(t_uc, 0.0)
    t_c = max(t_c, 0.0)
    a = t_uc * t_c + t_uc * (t_uc + 1.0) / 2.0
    return (
        p.c0 * t_uc / m.mean_new_tokens + p.c1 * t_uc + p.c2 * a + p.c3 * m.restore_fraction * t_c
    )


def reference_queue(s: ClusterState, node: int) -> float:
    r = s.reports[node]
    return sum(reference_price(s, node, q.t_uc, q.t_c) for q in r.queued)


def reference_wait(s: ClusterState, node: int, now: float, queued: float | None = None) -> float:
    """W_n from scratch; `queued`: the report's queue as priced when it arrived or when the
    node's model or predictor last changed."""
    wait = 0.0
    r = s.reports.get(node)
    if r is not None and now - r.t <= s.max_report_age_s:
        if queued is None:
            queued = reference_queue(s, node)
        wait = max(0.0, r.remaining_s - (now - r.t)) + queued
    for _, q in s.sent.get(node, {}).values():
        wait += reference_price(s, node, q.t_uc, q.t_c)
    return wait


tokens = st.one_of(st.integers(-50, 70_000), st.floats(-50.0, 70_000.0))
node = st.sampled_from(NODES)
rid = st.integers(0, 11).map(lambda i: f"r{i}")
work = st.tuples(rid, tokens, tokens)
op = st.one_of(
    st.tuples(st.just("send"), node, work),
    st.tuples(
        st.just("report"),
        node,
        st.lists(work, max_size=4),
        st.floats(0.0, 3.0),
        st.none() | st.frozensets(rid, max_size=6),
    ),
    st.tuples(st.just("release"), node, rid),
    st.tuples(st.just("models"), st.lists(st.tuples(node, st.integers(0, len(MODELS) - 1)))),
    st.tuples(st.just("predictor"), node, st.integers(0, len(PREDICTORS) - 1)),
    st.tuples(st.just("advance"), st.sampled_from([0.0, 0.01, 0.4, 2.5, 6.0, 70.0])),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(op, min_size=1, max_size=40))
def test_memoized_wait_is_the_from_scratch_sum(ops: list[tuple]) -> None:
    s = ClusterState(
        phases=dict.fromkeys(NODES, "prefill"),
        models=dict.fromkeys(NODES, MODELS[0]),
        directory=KVDirectory(64),
    )
    view = ClusterView(s)
    now = 100.0
    queued: dict[int, float] = {}
    for o in ops:
        kind = o[0]
        if kind == "send":
            _, n, (r, t_uc, t_c) = o
            s.record_sent(n, QueuedWork(r, t_uc, t_c), now)
        elif kind == "report":
            _, n, queue, remaining, seen = o
            q = tuple(QueuedWork(f"q{r}", t_uc, t_c) for r, t_uc, t_c in queue)
            s.report(NodeReport(n, now, "prefill", q, remaining, len(q), seen))
            queued[n] = reference_queue(s, n)
        elif kind == "release":
            s.release_sent(o[1], o[2])
        elif kind == "models":
            s.set_models({n: MODELS[k] for n, k in o[1]})
            for n, _ in o[1]:  # a node's queue is repriced with its new model at once
                if n in s.reports:
                    queued[n] = reference_queue(s, n)
        elif kind == "predictor":
            s.set_prefill_predictor(o[1], PREDICTORS[o[2]])
            if o[1] in s.reports:
                queued[o[1]] = reference_queue(s, o[1])
        else:
            now += o[1]
        for n in NODES:
            got = view.prefill_wait(n, now)
            want = reference_wait(s, n, now, queued.get(n))
            assert got.hex() == float(want).hex(), (n, got, want, kind)


def test_bound_eq3_is_the_formula_on_edge_inputs() -> None:
    values = [0, 1, -3, 0.0, -0.0, -2.5, 1e-300, 0.5, 8191, 65536.0, 1e9, math.inf]
    s = ClusterState(phases={0: "prefill"}, models={0: MODELS[1]}, directory=KVDirectory(64))
    for model in MODELS:
        s.set_models({0: model})
        price = eq3_pricer(model)
        for t_uc in values:
            for t_c in values:
                got, want = price(t_uc, t_c), reference_price(s, 0, t_uc, t_c)
                assert repr(got) == repr(want), (model, t_uc, t_c, got, want)
                assert repr(ClusterView(s).prefill_time(0, t_uc, t_c)) == repr(want)
        # A NaN stays a NaN, as max(nan, 0.0) keeps it.
        assert math.isnan(price(math.nan, 100.0)) and math.isnan(price(100.0, math.nan))


def test_changes_drop_the_memos_they_make_stale() -> None:
    s = ClusterState(
        phases=dict.fromkeys(NODES, "prefill"),
        models=dict.fromkeys(NODES, MODELS[0]),
        directory=KVDirectory(64),
    )
    view = ClusterView(s)
    for i in range(3):
        s.record_sent(0, QueuedWork(f"r{i}", 1000.0 * (i + 1), 0.0), 1.0)
    before = view.prefill_wait(0, 1.0)
    assert len(s.sent_price_memo[0]) == 3
    s.record_sent(0, QueuedWork("r3", 500.0, 0.0), 1.0)  # appended: the memo extends
    assert len(s.sent_price_memo[0]) == 3 and view.prefill_wait(0, 1.0) > before
    assert len(s.sent_price_memo[0]) == 4
    s.record_sent(0, QueuedWork("r1", 9000.0, 0.0), 1.0)  # re-sent: its price changes
    assert 0 not in s.sent_price_memo
    assert view.prefill_wait(0, 1.0) == reference_wait(s, 0, 1.0)
    s.release_sent(0, "r2")
    assert 0 not in s.sent_price_memo
    s.release_sent(0, "nope")  # not sent there: nothing changes
    view.prefill_wait(0, 1.0)
    s.release_sent(0, "nope")
    assert 0 in s.sent_price_memo
    s.report(NodeReport(0, 1.0, "prefill", (QueuedWork("q", 2000.0, 0.0),), 0.1, 1, frozenset()))
    view.prefill_wait(0, 1.0)
    assert 0 in s.queue_memo
    s.set_models({0: MODELS[2]})
    assert 0 not in s.sent_price_memo and 0 not in s.pricers and 0 not in s.queue_memo
    assert view.prefill_wait(0, 1.0) == reference_wait(s, 0, 1.0)
    s.set_prefill_predictor(0, scaled)
    assert 0 not in s.sent_price_memo and 0 not in s.pricers
    assert view.prefill_wait(0, 1.0) == reference_wait(s, 0, 1.0)
    s.report(NodeReport(0, 2.0, "prefill"))  # everything sent by t = 2 arrived
    assert 0 not in s.sent_price_memo and not s.sent[0]
    assert view.prefill_wait(0, 2.0) == 0.0
