"""Property tests (hypothesis) of the directory, branch counts and eviction (Alg. E.1/E.2).

Random sequences of new branches, forks, sub-agents, appends, compactions, finishes, moves,
cross-phase transfers, phase switches, KV events and evictions must keep the invariants:
counts equal a brute-force recount from the branch table, never negative, at most one copy
per phase per branch; under branch-aware eviction no referenced block is evicted while a
zero-count block remains.
"""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from cluster.core import KVEvent, KVEventKind
from cluster.kv.branches import BranchTable
from cluster.kv.directory import KVDirectory
from cluster.kv.eviction import BranchAwareEviction
from cluster.kv.hashing import ContextHasher
from cluster.kv.tier_cache import TierCache
from cluster.workloads.program import Segment

BT = 4
NODES = [0, 1, 2, 3, 4]


class ControlPlaneMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.phase = {0: "prefill", 1: "prefill", 2: "prefill", 3: "decode", 4: "decode"}
        self.d = KVDirectory(BT)
        self.t = BranchTable(self.d, self.phase.__getitem__)
        self.ctx: dict[str, ContextHasher] = {}
        self.n_branches = 0
        self.clock = 0.0
        self.next_seg = 1000
        self.host = {
            n: TierCache(n, "host", 40, BranchAwareEviction(), lambda h, n=n: self.d.count(n, h))
            for n in NODES
        }
        self.d.zero_listeners.append(lambda n, hs: self.host[n].on_counts_zeroed(hs))

    def _tick(self) -> float:
        self.clock += 1.0
        return self.clock

    def _seg(self, tokens: int) -> Segment:
        self.next_seg += 1
        return Segment(self.next_seg, tokens)

    def _request(self, b: str, node: int) -> None:
        now = self._tick()
        self.t.on_request(b, list(self.ctx[b].hashes), now)
        self.t.place(b, node, now)
        self._store(node, self.ctx[b].hashes, now)
        self.t.confirm(b, node, now)

    def _store(self, node: int, hashes: list[int], now: float) -> None:
        """The engine stores the path and evicts as needed (KV events to the directory)."""
        evicted = self.host[node].insert(hashes, BT, now, 0)
        if hashes:
            self.d.apply(KVEvent(now, node, KVEventKind.STORED, "host", tuple(hashes), 0, BT))
        for ev in evicted:
            self.d.apply(KVEvent(now, node, KVEventKind.REMOVED, "host", (ev.block_hash,)))

    branches = st.sampled_from([f"b{i}" for i in range(12)])

    @rule(tokens=st.integers(1, 20), node=st.sampled_from([0, 1, 2]), shared=st.booleans())
    def new_branch(self, tokens, node, shared):
        b = f"b{self.n_branches}"
        if self.n_branches >= 12:
            return
        self.n_branches += 1
        h = ContextHasher(BT)
        h.extend([Segment(1, 8)] if shared else [])  # a shared system prompt
        h.extend([self._seg(tokens)])
        self.ctx[b] = h
        self._request(b, node)

    @rule(
        data=st.data(),
        tokens=st.integers(1, 12),
        node=st.sampled_from([0, 1, 2]),
        sub=st.booleans(),
    )
    def fork_or_subagent(self, data, tokens, node, sub):
        live = sorted(self.t.branches)
        if not live or self.n_branches >= 12:
            return
        parent = data.draw(st.sampled_from(live))
        b = f"b{self.n_branches}"
        self.n_branches += 1
        if sub:
            h = ContextHasher(BT)
            h.extend([Segment(2, 8), self._seg(tokens)])
        else:
            h = self.ctx[parent].copy()
            h.extend([self._seg(tokens)])
        self.ctx[b] = h
        now = self._tick()
        self.t.on_request(
            b, list(h.hashes), now, kind="subagent" if sub else "fork", parent_id=parent
        )
        self.t.place(b, node, now)
        self._store(node, h.hashes, now)

    @rule(data=st.data(), tokens=st.integers(1, 12), node=st.sampled_from([0, 1, 2]))
    def append(self, data, tokens, node):
        live = sorted(self.t.branches)
        if not live:
            return
        b = data.draw(st.sampled_from(live))
        self.ctx[b].extend([self._seg(tokens)])
        self._request(b, node)

    @rule(data=st.data(), tokens=st.integers(1, 12), node=st.sampled_from([0, 1, 2]))
    def compact(self, data, tokens, node):
        live = sorted(self.t.branches)
        if not live:
            return
        b = data.draw(st.sampled_from(live))
        self.ctx[b] = self.ctx[b].truncated(1)
        self.ctx[b].extend([self._seg(tokens)])
        self._request(b, node)

    @rule(data=st.data(), node=st.sampled_from([3, 4]))
    def transfer_to_decode(self, data, node):
        live = sorted(self.t.branches)
        if not live or self.phase[node] != "decode":
            return
        b = data.draw(st.sampled_from(live))
        now = self._tick()
        self.t.place(b, node, now)
        self._store(node, self.ctx[b].hashes, now)
        self.t.confirm(b, node, now)

    @rule(data=st.data())
    def finish(self, data):
        live = sorted(self.t.branches)
        if live:
            self.t.finish(data.draw(st.sampled_from(live)), self._tick())

    @rule(node=st.sampled_from(NODES))
    def switch_phase(self, node):
        cur = self.phase[node]
        if sum(1 for p in self.phase.values() if p == cur) <= 1:
            return
        new = "decode" if cur == "prefill" else "prefill"
        self.phase[node] = new
        self.t.on_phase_switch(node, cur, new, self._tick())

    @rule(node=st.sampled_from(NODES), need=st.integers(4, 24))
    def evict(self, node, need):
        cache = self.host[node]
        zero = {h for h in cache.entries if self.d.count(node, h) == 0}
        evicted = cache.evict(need)
        seen: set[int] = set()
        for ev in evicted:
            if ev.branch_count > 0:
                assert zero <= seen, (
                    "a referenced block was evicted while a zero-count block remained"
                )
            assert ev.branch_count == self.d.count(node, ev.block_hash)
            seen.add(ev.block_hash)
        now = self._tick()
        for ev in evicted:
            self.d.apply(KVEvent(now, node, KVEventKind.REMOVED, "host", (ev.block_hash,)))

    @rule(node=st.sampled_from(NODES))
    def clear(self, node):
        self.host[node].clear()
        self.d.apply(KVEvent(self._tick(), node, KVEventKind.CLEARED, None))

    @invariant()
    def counts_match_recount(self):
        self.t.check_invariants()
        self.d.check_invariants()
        for c in self.host.values():
            c.check_invariants()


TestControlPlane = ControlPlaneMachine.TestCase
TestControlPlane.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
