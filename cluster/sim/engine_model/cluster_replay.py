"""Replay requests on a cluster of engine models: a front end, PD splits, a shared pool.

One discrete-event loop over instances that each step on their own clock (vLLM engines of
one cluster do not synchronize), sharing what connects them:
- a front end spreads arriving requests over the instances that take new requests (roles
  "both" and "prefill"): `round_robin` in arrival order (LLMServingSim's real runs: the
  figure 7 two-instance run's per-instance prefix-cache queries are exactly the prompt
  tokens of the even- and of the odd-indexed requests; vLLM's disaggregated-serving proxy
  examples cycle through their instances the same way), or `least_loaded` (fewest
  requests running and waiting);
- a PD split (vLLM's disaggregated prefill behind its PD proxy): the proxy sends a request
  to a prefill instance with max_tokens = 1; when that instance has prefilled it, its KV
  goes over the link (`kv_transfer_s`) to a decode instance (round robin), which admits it
  with all prompt tokens but the last already computed (vLLM recomputes the last one to
  sample), so the first token the client sees comes from the decode instance: TTFT =
  prefill queue and compute + KV transfer + the decode instance's queue and first step.
  The prefill instance's own sampled token is discarded (not counted as output);
- a shared CPU prefix pool (shared_pool.SharedPrefixPool, each engine's KV connector):
  engines store what they compute and load prefixes others computed.
Each instance's iteration is its scheduler's batch (scheduler.StepScheduler: vLLM V1's
rules, prefix caching in prefix_pool) priced by its own `price` plus the batch's pool
loads. Requests arriving while an instance computes are seen by its next iteration.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from cluster.core import ConfigError
from cluster.sim.engine_model.block_pool import blocks_for
from cluster.sim.engine_model.scheduler import ScheduledBatch, StepScheduler
from cluster.sim.engine_model.sequence import EngineRequest
from cluster.sim.engine_model.shared_pool import SharedPrefixPool

ROLES = ("both", "prefill", "decode")
FRONTENDS = ("round_robin", "least_loaded")
_ADD, _END, _START = 0, 1, 2  # same-time order: requests join before an engine steps


class Instance(NamedTuple):
    """One engine of the cluster: its role, scheduler and iteration price (seconds)."""

    role: str
    scheduler: StepScheduler
    price: Callable[[ScheduledBatch], float]


class ClusterRequest(NamedTuple):
    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    block_hashes: tuple[int, ...] = ()


class ServedRequest(NamedTuple):
    """A replayed request as the client saw it, and where it ran."""

    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    first_token_s: float
    done_s: float
    instance: int  # where it was admitted (the prefill instance of a PD split)
    decode_instance: int
    local_hit_tokens: int
    external_hit_tokens: int


@dataclass(slots=True)
class InstanceTrace:
    """What one instance did: per iteration its end time and output tokens sampled, and
    its state after it (running, waiting, KV blocks in use, prefix-cache counters)."""

    role: str
    iterations: int = 0
    busy_s: float = 0.0
    tokens: list[tuple[float, int]] = field(default_factory=list)
    # t, running, waiting, kv blocks in use, queries, local hits, external hits (tokens)
    state: list[tuple[float, int, int, int, int, int, int]] = field(default_factory=list)


class ClusterReplay(NamedTuple):
    requests: list[ServedRequest]
    instances: list[InstanceTrace]
    pool: SharedPrefixPool | None


@dataclass(slots=True, eq=False)
class _Node:
    index: int
    inst: Instance
    trace: InstanceTrace
    batch: ScheduledBatch | None = None
    gen_before: int = 0
    start_s: float = 0.0
    pending: bool = False  # a start event is queued


def _check(instances: Sequence[Instance], frontend: str) -> None:
    if not instances:
        raise ConfigError("a cluster needs at least one instance")
    bad = [i.role for i in instances if i.role not in ROLES]
    if bad:
        raise ConfigError(f"instance role {bad[0]!r} is not one of {', '.join(ROLES)}")
    if frontend not in FRONTENDS:
        raise ConfigError(f"front end {frontend!r} is not one of {', '.join(FRONTENDS)}")
    roles = {i.role for i in instances}
    if ("prefill" in roles) != ("decode" in roles):
        raise ConfigError("a PD split needs both a prefill and a decode instance")
    if "both" in roles and "prefill" in roles:
        raise ConfigError("mixing collocated instances and a PD split is not modelled")


def replay_cluster(
    requests: Sequence[ClusterRequest],
    instances: Sequence[Instance],
    *,
    frontend: str = "round_robin",
    kv_transfer_s: Callable[[int], float] = lambda _tokens: 0.0,
    pool: SharedPrefixPool | None = None,
) -> ClusterReplay:
    """Replay `requests` (any order) until every one has finished (module docstring)."""
    _check(instances, frontend)
    nodes = [_Node(i, inst, InstanceTrace(inst.role)) for i, inst in enumerate(instances)]
    entry = [n for n in nodes if n.inst.role != "decode"]
    decode = [n for n in nodes if n.inst.role == "decode"]
    for n in nodes:
        cap = n.inst.scheduler.pool.num_blocks
        bs = n.inst.scheduler.pool.block_size
        for r in requests:
            need = blocks_for(r.prompt_tokens + r.output_tokens - 1, bs)
            if need > cap:
                raise ConfigError(
                    f"request {r.request_id!r} needs {need} KV blocks ({r.prompt_tokens} + "
                    f"{r.output_tokens} tokens); instance {n.index} has {cap}"
                )
    heap: list[tuple[float, int, int, object]] = []
    seq = 0

    def push(t: float, kind: int, data: object) -> None:
        nonlocal seq
        heapq.heappush(heap, (t, kind, seq, data))
        seq += 1

    order = sorted(requests, key=lambda r: r.arrival_s)  # stable: ties keep the given order
    by_id = {r.request_id: r for r in order}
    if len(by_id) != len(order):
        raise ConfigError("request ids repeat")
    for r in order:
        push(r.arrival_s, _ADD, ("arrive", r))
    placed: dict[str, tuple[int, EngineRequest]] = {}  # id -> (entry node, its request)
    second: dict[str, tuple[int, EngineRequest]] = {}  # id -> (decode node, its request)
    rr = {"entry": 0, "decode": 0}

    def pick(group: list[_Node], key: str) -> _Node:
        if frontend == "least_loaded":
            return min(
                group,
                key=lambda n: (
                    len(n.inst.scheduler.running) + len(n.inst.scheduler.waiting),
                    n.index,
                ),
            )
        n = group[rr[key] % len(group)]
        rr[key] += 1
        return n

    def add(node: _Node, req: EngineRequest, t: float) -> None:
        node.inst.scheduler.add(req)
        if node.batch is None and not node.pending:
            node.pending = True
            push(t, _START, node)

    def start(node: _Node, t: float) -> None:
        sched = node.inst.scheduler
        if sched.idle:
            return
        batch = sched.schedule()
        if not batch.entries:
            raise RuntimeError(f"instance {node.index}: nothing schedulable at t={t:.3f}s")
        node.batch, node.start_s = batch, t
        node.gen_before = sum(r.generated_tokens for r, _ in batch.entries)
        push(t + node.inst.price(batch) + batch.load_s, _END, node)

    def end(node: _Node, t: float) -> None:
        batch, sched, tr = node.batch, node.inst.scheduler, node.trace
        assert batch is not None
        done = sched.finish(batch, t)
        node.batch = None
        tr.iterations += 1
        tr.busy_s += t - node.start_s
        sampled = sum(r.generated_tokens for r, _ in batch.entries) - node.gen_before
        if node.inst.role != "prefill":
            tr.tokens.append((t, sampled))
        if pool is not None and sched.connector is pool:
            for r, _ in batch.entries:
                pool.store(r, t)
        st = sched.stats
        tr.state.append(
            (t, len(sched.running), len(sched.waiting), sched.pool.kv_blocks_in_use,
             st.queries, st.local_hits, st.external_hits)
        )  # fmt: skip
        if node.inst.role == "prefill":
            for r in done:
                push(t + kv_transfer_s(r.prompt_tokens), _ADD, ("kv_ready", r))
        start(node, t)

    while heap:
        t, kind, _, data = heapq.heappop(heap)
        if kind == _START:
            node = data  # type: ignore[assignment]
            assert isinstance(node, _Node)
            node.pending = False
            if node.batch is None:
                start(node, t)
        elif kind == _END:
            assert isinstance(data, _Node)
            end(data, t)
        else:
            what, r = data  # type: ignore[misc]
            if what == "arrive":
                node = pick(entry, "entry")
                pd = node.inst.role == "prefill"
                er = EngineRequest(
                    r.request_id, r.arrival_s, r.prompt_tokens, 1 if pd else r.output_tokens,
                    block_hashes=r.block_hashes,
                )  # fmt: skip
                placed[r.request_id] = (node.index, er)
                add(node, er, t)
            else:  # the prefill instance's KV reached a decode instance
                src = by_id[r.request_id]
                dnode = pick(decode, "decode")
                er = EngineRequest(
                    src.request_id, src.arrival_s, src.prompt_tokens, src.output_tokens,
                    block_hashes=src.block_hashes, remote_kv_tokens=src.prompt_tokens - 1,
                )  # fmt: skip
                second[src.request_id] = (dnode.index, er)
                add(dnode, er, t)
    return ClusterReplay(_served(order, placed, second), [n.trace for n in nodes], pool)


def _served(
    order: Sequence[ClusterRequest],
    placed: dict[str, tuple[int, EngineRequest]],
    second: dict[str, tuple[int, EngineRequest]],
) -> list[ServedRequest]:
    out = []
    for r in order:
        i, er = placed[r.request_id]
        j, dr = second.get(r.request_id, (i, er))
        if dr.first_token_s is None or dr.done_s is None:
            raise RuntimeError(f"request {r.request_id!r} did not finish")
        out.append(
            ServedRequest(
                r.request_id,
                r.arrival_s,
                r.prompt_tokens,
                r.output_tokens,
                dr.first_token_s,
                dr.done_s,
                i,
                j,
                er.local_hit_tokens,
                er.external_hit_tokens,
            )
        )
    return out
