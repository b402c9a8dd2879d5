"""Routers (paper 000 §5.3, Alg. E.3 inner loop; SGLang Model Gateway; Dynamo KV router)."""

import pytest

from cluster.control.routing import (
    ROUTERS,
    CacheAwareRouter,
    DynamoKVRouter,
    FewestRequestsBinder,
    PredictedTTFTRouter,
)
from cluster.control.state import ClusterState, ClusterView, NodeReport, QueuedWork, RouteRequest
from cluster.kv.directory import KVDirectory
from cluster.kv.hashing import chain_path as path
from models import DecodeModel, FetchModel, NodeModel, PrefillModel

BT = 256
MODEL = NodeModel(PrefillModel(0.03, 8e-5, 4e-10, 3e-7), DecodeModel(0.012, 0.015, 2.8e-4))


def cluster(
    phases: dict[int, str], kv_fetch: str = "async", copy_price: float = 0.0
) -> ClusterState:
    d = KVDirectory(BT)
    return ClusterState(
        phases=phases,
        models={n: MODEL for n in phases},
        directory=d,
        kv_fetch=kv_fetch,
        copy_price_s_per_token=copy_price,
        fetch=FetchModel(),
    )


def req(p: list[int], t_in: int, now: float = 10.0, rid: str = "r") -> RouteRequest:
    return RouteRequest(rid, "prog", "b", p, t_in, now)


def test_ttft_router_moves_request_off_overloaded_node_holding_its_prefix():
    s = cluster({0: "prefill", 1: "prefill"})
    ctx = path("agent", 200)  # 51K tokens of context held on node 0
    s.directory.store(0, ctx, 0, "host", 1.0)
    busy = tuple(QueuedWork(f"q{i}", 8000, 30_000) for i in range(20))  # ~20 s of queued work
    s.report(NodeReport(0, 9.9, "prefill", busy, 0.5, 1))
    s.report(NodeReport(1, 9.9, "prefill", (), 0.0, 0))
    d = PredictedTTFTRouter().route(req(ctx + path("new", 4), 205 * BT), ClusterView(s))
    assert d.node_id == 1
    assert d.cached_tokens == 0 and d.fetch_tokens == 200 * BT  # node 1 fetches the prefix
    # With an idle holder, the prefix keeps the request there (no fetch to pay).
    s.report(NodeReport(0, 9.95, "prefill", (), 0.0, 0))
    d2 = PredictedTTFTRouter().route(req(ctx + path("new", 4), 205 * BT), ClusterView(s))
    assert d2.node_id == 0 and d2.fetch_tokens == 0


def test_fetch_longer_than_the_wait_is_charged():
    s = cluster({0: "prefill", 1: "prefill"})
    ctx = path("agent", 400)  # 102K tokens: tau = 0.45 s + 0.1 s
    s.directory.store(2, ctx, 0, "host", 1.0)  # only a decode node's pool holds it
    s.phases[2] = "decode"
    s.models[2] = MODEL
    s.report(NodeReport(0, 9.9, "prefill", (QueuedWork("a", 1000, 0),), 0.0, 1))  # short wait
    s.report(NodeReport(1, 9.9, "prefill", (), 0.0, 0))
    view = ClusterView(s)
    r = req(ctx + path("x", 2), 402 * BT)
    d = PredictedTTFTRouter().route(r, view)
    x = 400 * BT
    tau = FetchModel().time(x)
    service = view.prefill_time(d.node_id, 402 * BT - x, x)
    wait = view.prefill_wait(d.node_id, r.now)
    assert d.fetch_tokens == x and tau > wait
    assert d.predicted_ttft_s == pytest.approx(
        wait + service + (tau - wait)
    )  # exposed part charged
    # The copy price adds kappa * x on top.
    s.copy_price_s_per_token = 1e-6
    d3 = PredictedTTFTRouter().route(r, ClusterView(s))
    assert d3.predicted_ttft_s == pytest.approx(d.predicted_ttft_s + 1e-6 * x)


def test_stale_reports_are_ignored():
    s = cluster({0: "prefill", 1: "prefill"})
    s.report(
        NodeReport(
            0, 1.0, "prefill", tuple(QueuedWork(f"q{i}", 8000, 0) for i in range(50)), 5.0, 1
        )
    )
    s.report(NodeReport(1, 9.0, "prefill", (QueuedWork("a", 8000, 0),), 0.0, 1))
    # Node 0's report is 9 s old at t=10 (> 5 s): its queue is not believed.
    d = PredictedTTFTRouter().route(req(path("p", 8), 8 * BT, now=10.0), ClusterView(s))
    assert d.node_id == 0


def test_sent_but_not_reported_requests_count():
    s = cluster({0: "prefill", 1: "prefill"})
    for n in (0, 1):
        s.report(NodeReport(n, 9.0, "prefill", (), 0.0, 0))
    router = PredictedTTFTRouter()
    for i in range(3):  # three requests sent to node 0 after its last report
        s.record_sent(0, QueuedWork(f"s{i}", 8000, 0), 9.5)
    d = router.route(req(path("p", 8), 8 * BT), ClusterView(s))
    assert d.node_id == 1


def _gateway(loads: dict[int, int], trees: dict[int, list[int]], **kw) -> CacheAwareRouter:
    r = CacheAwareRouter(**kw)
    r.load.update(loads)
    for n, p in trees.items():
        r._insert(n, p, BT)
    return r


def test_cache_aware_gateway_decisions():
    """Hand-built cases from the gateway's documented policy (sgl-model-gateway)."""
    s = cluster({0: "prefill", 1: "prefill", 2: "prefill"})
    view = ClusterView(s)
    shared = path("sys", 40)
    # 1. Balanced loads, match rate 40/50 = 0.8 > 0.3 on node 1 -> the best-matching node.
    r = _gateway({0: 3, 1: 5, 2: 4}, {1: shared, 2: shared[:10]})
    assert r.route(req(shared + path("u", 10), 50 * BT), view).node_id == 1
    # 2. Match rate 10/100 = 0.1 <= 0.3 -> the worker with the smallest tree.
    r = _gateway(
        {0: 3, 1: 5, 2: 4}, {0: path("a", 30), 1: shared[:10] + path("b", 25), 2: path("c", 20)}
    )
    assert r.route(req(shared[:10] + path("u", 90), 100 * BT), view).node_id == 2
    # 3. Imbalanced: max - min = 100 > 64 and 110 > 1.5 * 10 -> shortest queue, ignoring cache.
    r = _gateway({0: 110, 1: 10, 2: 40}, {0: shared})
    assert r.route(req(shared + path("u", 10), 50 * BT), view).node_id == 1
    # 4. Absolute gap 60 <= 64: still balanced even though 70 > 1.5 * 10 -> cache wins.
    r = _gateway({0: 70, 1: 10, 2: 20}, {0: shared})
    assert r.route(req(shared + path("u", 10), 50 * BT), view).node_id == 0
    # 5. Relative gap below 1.5x: 200 - 140 = 60 < 64 anyway; 300 vs 200: 100 > 64 but 300 <= 1.5*200.
    r = _gateway({0: 300, 1: 200, 2: 250}, {0: shared})
    assert r.route(req(shared + path("u", 10), 50 * BT), view).node_id == 0
    # Loads follow the requests it routed and release on completion.
    before = r.load[0]
    r.on_done("r", 0)
    assert r.load[0] == before - 1


def test_dynamo_cost_credits_host_hits_at_three_quarters():
    s = cluster({0: "prefill", 1: "prefill"}, kv_fetch="none")
    p = path("ctx", 100)
    s.directory.store(0, p[:80], 0, "gpu", 1.0)  # 80 GPU blocks on node 0
    s.directory.store(1, p, 0, "host", 1.0)  # 100 host blocks on node 1
    r = DynamoKVRouter()
    d = r.route(req(p, 100 * BT), ClusterView(s))
    # cost0 = 100 - 80 = 20; cost1 = 100 - 0.75 * 100 = 25 -> node 0
    assert d.node_id == 0
    # Node 0 now carries 100 active prefill blocks: cost0 = 120 > 25 -> node 1.
    assert r.route(req(p, 100 * BT, rid="r2"), ClusterView(s)).node_id == 1
    r.on_prefill_done("r", 0)
    assert r.active_prefill[0] == 0


def test_decode_binder_prefers_room_then_fewest_requests():
    s = cluster({0: "prefill", 1: "decode", 2: "decode", 3: "decode"})
    s.report(NodeReport(1, 9.9, "decode", (), 0.0, 2, None, 900, 1000))  # no room for 500
    s.report(NodeReport(2, 9.9, "decode", (), 0.0, 5, None, 100, 1000))
    s.report(NodeReport(3, 9.9, "decode", (), 0.0, 3, None, 200, 1000))
    s.decode_load.update({1: 2, 2: 5, 3: 3})
    assert FewestRequestsBinder().bind(req([], 0), 500, ClusterView(s)) == 3


def test_all_routers_registered():
    assert {"cache-aware", "dynamo", "least-loaded", "round-robin", "sticky", "ttft"} <= set(
        ROUTERS.names()
    )
    with pytest.raises(ValueError, match="choose one of"):
        ROUTERS.create("nope")


def test_the_prefill_wait_is_the_running_batch_its_queue_and_what_was_sent_since():
    """W_n = remaining time of the running batch (per a fresh report) + Eq. 3 over the
    report's queue + Eq. 3 over the requests sent since; a stale report counts nothing."""
    s = cluster({0: "prefill"})
    view = ClusterView(s)
    assert view.prefill_wait(0, 10.0) == 0.0
    queue = (QueuedWork("a", 3000, 1000), QueuedWork("b", 500, 0))
    s.report(NodeReport(0, 9.0, "prefill", queue, 0.4, 1))  # 0.4 s left at t = 9
    s.record_sent(0, QueuedWork("c", 2000, 4000), 9.5)
    queued = sum(view.prefill_time(0, q.t_uc, q.t_c) for q in queue)
    sent = view.prefill_time(0, 2000, 4000)
    assert view.prefill_wait(0, 9.2) == pytest.approx(0.2 + queued + sent)
    assert view.prefill_wait(0, 9.9) == pytest.approx(queued + sent)  # the batch is done
    assert view.prefill_wait(0, 14.5) == pytest.approx(sent)  # the report is stale (> 5 s)
