"""Prefill routers and decode binders behind one protocol (paper 000 §5.3, Alg. E.3; SPEC §4).

- `ttft`: predicted TTFT (Eq. 7 + Alg. E.3): for each prefill node n, t_c,n is the longest
  prefix cached on n or anywhere in the shared pool, x_n the part only another node holds;
  W_n = T_rem + sum of Eq. 3 over the node's queue and the requests sent but not yet
  reported; T_hat = W + T_P^req(w_n) + max(0, tau(x_n) - W) + kappa*x_n, plus a live
  cluster's expected serving overheads before the first token (models.overheads: proxy,
  wake-up, KV hand-off, join, streaming; 0 without); ties go to the longest local prefix. A report older than 5 s is ignored (W then counts sent requests only).
- `cache-aware`: the SGLang Model Gateway policy: when loads are imbalanced
  (max - min > balance_abs_threshold and max > balance_rel_threshold * min) route to the
  least loaded worker, else to the worker whose approximate tree (built from the requests it
  routed) matches the longest prefix if the match rate exceeds cache_threshold, else to the
  worker with the smallest tree.
- `dynamo`: Dynamo KV router cost prefill_load_scale * max(active prefill blocks + prompt
  blocks - overlap, 0) + decode blocks, overlap crediting GPU hits 1 and host hits 0.75.
- `sticky`, `round-robin`, `least-loaded`.
Decode binders: `fewest` (the node with KV room and the fewest requests, bound when
prefill starts) and `round-robin` (the gateway's decode routing).

Routers may keep their own memory of what they routed (the gateway's tree and loads,
Dynamo's active blocks); they never mutate cluster state.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol

from cluster.control.state import ClusterView, RouteDecision, RouteRequest
from cluster.core import ConfigError, Registry
from cluster.kv.hashing import prefix_in


class Router(Protocol):
    name: str

    def route(self, req: RouteRequest, view: ClusterView) -> RouteDecision:
        """Choose the prefill node; raises ConfigError when no prefill node is available."""
        ...

    def on_prefill_done(self, request_id: str, node: int) -> None: ...

    def on_done(self, request_id: str, node: int) -> None: ...


class DecodeBinder(Protocol):
    name: str

    def bind(
        self, req: RouteRequest, kv_tokens: int, view: ClusterView, exclude: int | None = None
    ) -> int:
        """Choose the decode node when the request's prefill starts."""
        ...


ROUTERS: Registry[Router] = Registry("router")
DECODE_BINDERS: Registry[DecodeBinder] = Registry("decode binder")


def _prefill_nodes(view: ClusterView) -> list[int]:
    nodes = view.nodes_in("prefill")
    if not nodes:
        raise ConfigError("no prefill node is available to route to")
    return nodes


class _Base:
    """No-op hooks for routers without memory of their own."""

    name = "base"

    def on_prefill_done(self, request_id: str, node: int) -> None:
        return None

    def on_done(self, request_id: str, node: int) -> None:
        return None


def local_decision(name: str, node: int, req: RouteRequest, view: ClusterView) -> RouteDecision:
    """A decision for routers that only use what the node itself holds (plus the pool if async)."""
    bt = view.directory.block_tokens
    m = view.directory.longest_prefix(req.path, [node], with_gpu=False)
    local = m.per_node[node] * bt
    fetch = max(m.cluster * bt - local, 0) if view.kv_fetch != "none" else 0
    if fetch and not view.fetch.fetches(fetch):
        fetch = 0
    return RouteDecision(node, name, None, local, fetch)


@ROUTERS.register("ttft")
class PredictedTTFTRouter(_Base):
    name = "ttft"

    def route(self, req: RouteRequest, view: ClusterView) -> RouteDecision:
        nodes = _prefill_nodes(view)
        d = view.directory
        bt = d.block_tokens
        now = req.now
        # A node whose last report is older than max_report_age_s contributes no state (its
        # wait counts only the requests sent to it since); health checks exclude dead nodes.
        cand = nodes
        match = d.longest_prefix(req.path, cand, with_gpu=False)
        pool = view.kv_fetch != "none"
        cluster_tokens = match.cluster * bt
        best: tuple[float, float, int] | None = None
        decision: RouteDecision | None = None
        fetch_model = view.fetch
        kappa = view.copy_price_s_per_token
        prefill_wait = view.prefill_wait
        prefill_time = view.prefill_time
        asynchronous = view.kv_fetch == "async"
        overhead = view.overhead_s
        for n in cand:
            local = match.per_node[n] * bt
            t_c = cluster_tokens if pool else local
            x = max(t_c - local, 0)
            if x and not fetch_model.fetches(x):
                t_c, x = local, 0  # below the fetch threshold: recompute instead
            t_uc = max(req.t_in - t_c, 1)
            wait = prefill_wait(n, now)
            service = prefill_time(n, t_uc, t_c)
            tau = fetch_model.time(x) if asynchronous else 0.0
            exposed = max(0.0, tau - wait) if asynchronous else fetch_model.time(x)
            t_hat = wait + service + exposed + kappa * x
            if overhead:
                t_hat += overhead
            key = (t_hat, -local, n)
            if best is None or key < best:
                best = key
                decision = RouteDecision(n, self.name, t_hat, local, x)
        assert decision is not None
        return decision


@ROUTERS.register("cache-aware")
class CacheAwareRouter(_Base):
    """SGLang Model Gateway cache-aware policy (approximate tree per worker + load balance)."""

    name = "cache-aware"

    def __init__(
        self,
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
        max_tree_tokens: int = 1 << 24,
    ) -> None:
        if not 0.0 <= cache_threshold <= 1.0:
            raise ConfigError(f"cache_threshold must be in [0, 1], got {cache_threshold}")
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.max_tree_tokens = max_tree_tokens
        self.load: dict[int, int] = {}
        self.trees: dict[int, OrderedDict[int, None]] = {}
        self._req_node: dict[str, int] = {}

    def route(self, req: RouteRequest, view: ClusterView) -> RouteDecision:
        nodes = _prefill_nodes(view)
        loads = {n: self.load.get(n, 0) for n in nodes}
        hi, lo = max(loads.values()), min(loads.values())
        imbalanced = hi - lo > self.balance_abs_threshold and hi > self.balance_rel_threshold * lo
        bt = view.directory.block_tokens
        if imbalanced:
            node = min(nodes, key=lambda n: (loads[n], n))
        else:
            matches = {
                n: prefix_in(req.path, self.trees.setdefault(n, OrderedDict())) for n in nodes
            }
            best = max(nodes, key=lambda n: (matches[n], -n))
            rate = matches[best] * bt / max(req.t_in, 1)
            if rate > self.cache_threshold:
                node = best
            else:
                node = min(nodes, key=lambda n: (len(self.trees[n]), n))
        self._insert(node, req.path, bt)
        self.load[node] = self.load.get(node, 0) + 1
        self._req_node[req.request_id] = node
        return local_decision(self.name, node, req, view)

    def _insert(self, node: int, path: Sequence[int], bt: int) -> None:
        tree = self.trees.setdefault(node, OrderedDict())
        # Leaf first, root last: the root is the most recent, so LRU trims leaves first.
        for h in reversed(path):
            if h in tree:
                tree.move_to_end(h)
            else:
                tree[h] = None
        limit = self.max_tree_tokens // bt
        while len(tree) > limit:
            tree.popitem(last=False)

    def on_done(self, request_id: str, node: int) -> None:
        n = self._req_node.pop(request_id, None)
        if n is not None:
            self.load[n] = max(self.load.get(n, 0) - 1, 0)


@ROUTERS.register("dynamo")
class DynamoKVRouter(_Base):
    """Dynamo KV router cost; it tracks the prefill and decode blocks it assigned."""

    name = "dynamo"

    def __init__(self, prefill_load_scale: float = 1.0, host_credit: float = 0.75) -> None:
        self.prefill_load_scale = prefill_load_scale
        self.host_credit = host_credit
        self.active_prefill: dict[int, int] = {}
        self.decode_blocks: dict[int, int] = {}
        self._req: dict[str, tuple[int, int]] = {}

    def route(self, req: RouteRequest, view: ClusterView) -> RouteDecision:
        nodes = _prefill_nodes(view)
        d = view.directory
        bt = d.block_tokens
        prompt_blocks = math.ceil(req.t_in / bt)
        m = d.longest_prefix(req.path, nodes)
        best_key: tuple[float, int] | None = None
        node = nodes[0]
        for n in nodes:
            gpu = m.gpu_per_node[n]
            host = m.per_node[n] - gpu
            overlap = gpu + self.host_credit * host
            cost = self.prefill_load_scale * max(
                self.active_prefill.get(n, 0) + prompt_blocks - overlap, 0.0
            )
            cost += self.decode_blocks.get(n, 0)
            key = (cost, n)
            if best_key is None or key < best_key:
                best_key, node = key, n
        self.active_prefill[node] = self.active_prefill.get(node, 0) + prompt_blocks
        self._req[req.request_id] = (node, prompt_blocks)
        return local_decision(self.name, node, req, view)

    def on_prefill_done(self, request_id: str, node: int) -> None:
        got = self._req.pop(request_id, None)
        if got is not None:
            n, blocks = got
            self.active_prefill[n] = max(self.active_prefill.get(n, 0) - blocks, 0)


@ROUTERS.register("sticky")
class StickySessionRouter(_Base):
    """Session affinity: a program keeps its first node while that node serves prefill."""

    name = "sticky"

    def __init__(self) -> None:
        self.home: dict[str, int] = {}

    def route(self, req: RouteRequest, view: ClusterView) -> RouteDecision:
        nodes = _prefill_nodes(view)
        node = self.home.get(req.program_id)
        if node not in nodes:
            node = min(nodes, key=lambda n: (view.outstanding(n, req.now), n))
            self.home[req.program_id] = node
        return local_decision(self.name, node, req, view)


@ROUTERS.register("round-robin")
class RoundRobinRouter(_Base):
    name = "round-robin"

    def __init__(self) -> None:
        self._i = 0

    def route(self, req: RouteRequest, view: ClusterView) -> RouteDecision:
        nodes = _prefill_nodes(view)
        node = nodes[self._i % len(nodes)]
        self._i += 1
        return local_decision(self.name, node, req, view)


@ROUTERS.register("least-loaded")
class LeastLoadedRouter(_Base):
    name = "least-loaded"

    def route(self, req: RouteRequest, view: ClusterView) -> RouteDecision:
        nodes = _prefill_nodes(view)
        node = min(nodes, key=lambda n: (view.outstanding(n, req.now), n))
        return local_decision(self.name, node, req, view)


@DECODE_BINDERS.register("fewest")
class FewestRequestsBinder:
    """The decode node with KV room for the request and the fewest requests (Alg. E.3 l.13)."""

    name = "fewest"

    def bind(
        self, req: RouteRequest, kv_tokens: int, view: ClusterView, exclude: int | None = None
    ) -> int:
        nodes = [n for n in view.nodes_in("decode") if n != exclude] or view.nodes_in("decode")
        if not nodes:
            raise ConfigError("no decode node is available to bind to")
        room = []
        for n in nodes:
            r = view.fresh_report(n, req.now)
            if (
                r is None
                or r.kv_gpu_capacity == 0
                or r.kv_gpu_capacity - r.kv_gpu_used >= kv_tokens
            ):
                room.append(n)
        pool = room or nodes
        return min(pool, key=lambda n: (view.decode_load(n), n))


@DECODE_BINDERS.register("round-robin")
class RoundRobinBinder:
    name = "round-robin"

    def __init__(self) -> None:
        self._i = 0

    def bind(
        self, req: RouteRequest, kv_tokens: int, view: ClusterView, exclude: int | None = None
    ) -> int:
        nodes = view.nodes_in("decode")
        if not nodes:
            raise ConfigError("no decode node is available to bind to")
        node = nodes[self._i % len(nodes)]
        self._i += 1
        return node


def decision_row(req: RouteRequest, decision: RouteDecision) -> dict[str, list[Any]]:
    """The `router_decisions` row of one routing decision."""
    return {
        "t": [req.now],
        "request_id": [req.request_id],
        "node_id": [decision.node_id],
        "policy": [decision.policy],
        "predicted_ttft_s": [decision.predicted_ttft_s],
        "cached_tokens": [decision.cached_tokens],
        "fetch_tokens": [decision.fetch_tokens],
    }
