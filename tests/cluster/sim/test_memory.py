"""Node KV memory and its KV events: the control plane's directory mirrors every node's
caches, and the `kv_events` table replays to that directory."""

from __future__ import annotations

import pytest

from cluster.core import KVEvent, KVEventKind, MemorySink
from cluster.kv.directory import GPU, HOST, KVDirectory
from cluster.kv.eviction import LRUEviction
from cluster.sim.buffer import BufferedSink
from cluster.sim.memory import KVMemory, kv_event_rows, stored_runs, tier_caches
from cluster.sim.simulator import SimConfig, Simulator
from cluster.sim.tiered_memory import TieredMemory

HOST_PRESSURE = dict(
    workload="cc",
    nodes=4,
    split="2P2D",
    agents=16,
    duration_s=450,
    warmup_s=0,
    planner="static",
    relaunch_s=100,
    l2_tokens=600_000,
    seed=2,
)


def _directory_holdings(d: KVDirectory, node: int) -> dict[int, int]:
    return d.node_holdings(node)


def _cache_holdings(sim: Simulator, node: int) -> dict[int, int]:
    mem = sim.nodes[node].memory
    held = dict.fromkeys(mem.l1.entries, GPU)
    if not mem.unified:
        for h in mem.l2.entries:
            held[h] = held.get(h, 0) | HOST
    return held


@pytest.mark.parametrize(
    "cfg",
    [
        SimConfig(**HOST_PRESSURE),  # type: ignore[arg-type]
        SimConfig(**HOST_PRESSURE | {"retention": "branch-count"}),  # type: ignore[arg-type]
        SimConfig(
            workload="putnam",
            nodes=1,
            split="collocated",
            agents=16,
            duration_s=300,
            warmup_s=0,
            planner="static",
            host_kv=False,
            retention="lru",
            l1_tokens=50_000,
            seed=3,
        ),
        SimConfig(**HOST_PRESSURE | {"host_kv": False, "l1_tokens": 150_000}),  # type: ignore[arg-type]
    ],
    ids=["tiered", "tiered-retention", "unified-pool", "pd-unified-pool"],
)
def test_the_directory_mirrors_every_node_cache(cfg):
    """Everything a node stores or drops reaches the directory as KV events, so at any
    time the directory's tiers per node are exactly the node's caches.

    Retention keys can make a chain reclaim its own blocks while it is inserted (the rest
    of the cache ranks higher); such blocks used to be published as stored (the directory
    then named holders that held nothing) or, reclaimed and inserted again, not at all."""
    sim = Simulator(cfg)
    switched = False
    for t in range(25, int(cfg.duration_s) + 1, 25):
        sim.step_until(float(t))
        if not switched and t >= 150 and not sim.cp.collocated:
            sim.cp.request_switch(3, "prefill", sim.now, trigger="manual", mode="relaunch")
            sim.cp.request_switch(0, "decode", sim.now, trigger="manual")
            switched = True
        for n in sim.node_ids:
            assert sim.cp.node_holdings(n) == _cache_holdings(sim, n), (t, n)
    summary = sim.finish()
    assert summary["requests"] > 50
    if not sim.cp.collocated:
        assert summary["switches"] == 2
    else:
        assert summary["preemptions_total"] > 0  # the pool was under pressure


def test_kv_events_table_replays_to_the_directory():
    """Replaying the `kv_events` rows (stored chains with parents, removals per tier,
    clears) into an empty directory gives the control plane's holdings (the
    directory keeps no parents: the chained hashes are the tree). The
    GPU copy a host eviction drops is a row of its own."""
    sink = MemorySink()
    sim = Simulator(SimConfig(**HOST_PRESSURE | {"retention": "branch-count"}), sink=sink)  # type: ignore[arg-type]
    sim.step_until(150.0)
    sim.cp.request_switch(3, "prefill", sim.now, trigger="manual", mode="relaunch")
    sim.cp.request_switch(0, "decode", sim.now, trigger="manual")
    sim.step_until(HOST_PRESSURE["duration_s"])  # type: ignore[arg-type]
    sim.finish()
    rows = sink.rows("kv_events")
    replay = KVDirectory(sim.profile.block_tokens)
    for r in rows:
        if r["kind"] == "stored":
            replay.store(r["node_id"], [r["block_hash"]], r["parent_hash"] or 0, r["tier"], r["t"])
        elif r["kind"] == "removed":
            replay.remove(r["node_id"], r["block_hash"], r["tier"])
        else:
            replay.clear_node(r["node_id"], r["tier"])
    for n in sim.node_ids:
        held = sim.cp.node_holdings(n)
        assert _directory_holdings(replay, n) == held
    cleared = [(r["node_id"], r["tier"]) for r in rows if r["kind"] == "cleared"]
    assert cleared == [(3, "gpu"), (3, "host")]
    host_out = {(r["t"], r["node_id"], r["block_hash"]) for r in rows if r["kind"] == "removed"}
    gpu_out = [
        (r["t"], r["node_id"], r["block_hash"])
        for r in rows
        if r["kind"] == "removed" and r["tier"] == "gpu"
    ]
    assert any(k in host_out for k in gpu_out)
    assert sim.cp.directory_stats()["events"] > 0  # the events go through the directory's entry


def test_a_store_publishes_one_batch_removals_first():
    """One publication per store: what its inserts reclaimed (a host eviction takes the GPU
    copy along), then the blocks newly held, tier by tier."""
    published: list[list[KVEvent]] = []
    directory = KVDirectory(4)

    def publish(events: list[KVEvent]) -> None:
        published.append(events)
        directory.apply_all(events)

    gpu, host = tier_caches(0, 16, 16, LRUEviction(), lambda h: 0)
    mem = TieredMemory(0, gpu, host, 4, BufferedSink(MemorySink()), publish)
    mem.store([1, 2, 3, 4], 0, 0, 1.0)  # both tiers full
    assert [[(e.kind, e.tier, e.block_hashes, e.parent_hash) for e in b] for b in published] == [
        [
            (KVEventKind.STORED, "host", (1, 2, 3, 4), None),
            (KVEventKind.STORED, "gpu", (1, 2, 3, 4), None),
        ]
    ]
    published.clear()
    mem.receive([1, 2, 5, 6], 2.0)  # host memory needs room for 5 and 6
    (batch,) = published
    assert [(e.kind, e.tier, e.block_hashes, e.parent_hash) for e in batch] == [
        (KVEventKind.REMOVED, "gpu", (4, 3), None),  # deepest first
        (KVEventKind.REMOVED, "host", (4, 3), None),
        (KVEventKind.STORED, "host", (5, 6), 2),
    ]
    assert directory.holders_of(1) == {0: GPU | HOST} and directory.holders_of(5) == {0: HOST}
    assert directory.holders_of(3) == {}
    assert set(gpu.entries) == {1, 2}


def test_kv_event_rows_chain_parents_and_clear_each_tier():
    rows = kv_event_rows(
        [
            KVEvent(1.0, 2, KVEventKind.STORED, "host", (7, 8, 9), 5, 16),
            KVEvent(2.0, 2, KVEventKind.REMOVED, "gpu", (9,), None, 16),
            KVEvent(3.0, 2, KVEventKind.CLEARED, None),
        ]
    )
    assert rows["parent_hash"] == [5, 7, 8, None, None, None]
    assert rows["kind"] == ["stored"] * 3 + ["removed", "cleared", "cleared"]
    assert rows["tier"] == ["host", "host", "host", "gpu", "gpu", "host"]
    assert rows["num_tokens"] == [16, 16, 16, 16, 0, 0]
    assert rows["block_hash"] == [7, 8, 9, 9, None, None]


def test_a_stored_row_names_the_block_before_it_as_parent(monkeypatch):
    """Stored KV events are chains of consecutive blocks (as engines send them): when a
    store skips blocks the cache already held, the chain is split, and every stored row's
    parent is its block's predecessor in the context (None for a context's first block)."""
    parent_of: dict[int, int | None] = {}
    insert = KVMemory._insert

    def watched(self, cache, tier, path, start, t, events):
        for j in range(start, len(path)):
            parent_of[path[j]] = path[j - 1] if j else None
        return insert(self, cache, tier, path, start, t, events)

    monkeypatch.setattr(KVMemory, "_insert", watched)
    sink = MemorySink()
    sim = Simulator(SimConfig(**HOST_PRESSURE | {"duration_s": 240}), sink=sink)  # type: ignore[arg-type]
    sim.run()
    stored = [r for r in sink.rows("kv_events") if r["kind"] == "stored"]
    assert len(stored) > 1000
    wrong = [r for r in stored if r["parent_hash"] != parent_of[r["block_hash"]]]
    assert wrong == []
    assert sum(r["parent_hash"] is None for r in stored) > 0  # contexts' first blocks


def test_stored_runs_split_a_store_at_the_blocks_already_held():
    path = [10, 11, 12, 13, 14, 15]
    assert stored_runs(path, 0, []) == []
    assert stored_runs(path, 2, [12, 13, 14, 15]) == [(11, (12, 13, 14, 15))]
    assert stored_runs(path, 0, [10, 11]) == [(None, (10, 11))]
    assert stored_runs(path, 1, [12, 13]) == [(11, (12, 13))]  # 11 was held already
    assert stored_runs(path, 0, [10, 12, 13, 15]) == [(None, (10,)), (11, (12, 13)), (14, (15,))]


def test_pd_nodes_without_a_host_tier_hand_kv_over_and_leak_none():
    """A PD split on unified pools (`host_kv=False`, the engines `pdlab twin` replays): a
    prefill node lets go of a call's KV at hand-off, its decode node takes the received
    blocks (pinned) and reserves the rest, decode nodes that run out preempt and recompute
    from their own pool. When every program has finished no pool holds a pin or a
    reservation, and no KV ever went to a host tier."""
    sink = MemorySink()
    cfg = SimConfig(
        workload="putnam",
        nodes=3,
        split="2P1D",
        agents=32,
        max_programs=32,
        duration_s=20_000,
        warmup_s=0,
        planner="static",
        host_kv=False,
        l1_tokens=50_000,
        max_num_seqs=64,
        seed=4,
    )
    sim = Simulator(cfg, sink=sink)
    peak: dict[int, int] = {}
    orch = sim.orchestrator
    while sim.now < cfg.duration_s and not (orch.arrivals == 32 and orch.active_programs == 0):
        sim.step_until(sim.now + 50.0)
        for n, node in sim.nodes.items():
            pool = node.memory.pool
            pool.check_invariants()
            held = pool.pinned_tokens + pool.reserved_tokens
            assert held <= pool.pool_tokens or len(node.decode_batch) <= 1, (sim.now, n)
            peak[n] = max(peak.get(n, 0), held)
    summary = sim.finish()
    assert sim.now < cfg.duration_s  # every program finished
    assert summary["requests"] > 700 and summary["preemptions_total"] > 20
    for n, node in sim.nodes.items():
        pool = node.memory.pool
        assert (pool.pinned_tokens, pool.reserved_tokens) == (0, 0), n
    assert all(peak.values())  # prefill and decode nodes held their calls' KV
    assert {r["tier"] for r in sink.rows("kv_events")} == {"gpu"}


def test_the_unified_pool_preempts_as_vllm_does():
    """When not one more decode iteration fits: under FCFS the call that joined the running
    batch last (vLLM's FCFS pops its running list, a resumed call joining it again at the
    end), under a priority policy the largest q (vLLM's priority scheduling)."""
    from types import SimpleNamespace

    from cluster.kv.retention_cache import RetentionCache
    from cluster.sim.entities import SimRequest
    from cluster.sim.unified_memory import UnifiedMemory

    run = SimpleNamespace(program=SimpleNamespace(program_id="p"))

    def call(name: str, q: float) -> SimRequest:
        r = SimRequest(name, run, 0, "b", [], 10, 10, 0.0, 0)  # type: ignore[arg-type]
        r.priority = r.t_release = q
        return r

    batch = [call("a", 5.0), call("b", 9.0), call("c", 1.0)]  # in the order they joined

    def victim(fifo: bool, free: int) -> str | None:
        pool = RetentionCache(0, "gpu", 100, "lru", lambda: 0.0)
        mem = UnifiedMemory(0, pool, 4, 1.0, BufferedSink(MemorySink()), lambda e: None, fifo)
        pool.reserve(100 - free)
        v = mem.preemption_victim(batch)
        return None if v is None else v.request_id

    assert victim(True, 0) == "c" and victim(False, 0) == "b"
    assert victim(True, 3) is None and victim(False, 3) is None  # one iteration of 3 fits
    assert victim(True, 2) == "c"
