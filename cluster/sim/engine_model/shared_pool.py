"""A CPU prefix pool shared by engines: paper 000's shared host tier, as LMCache serves it.

Engines with a KV connector (vLLM's LMCacheConnectorV1 against one LMCache server) store
the KV of every request they compute in the pool and, on a miss in their own GPU cache,
load the prefix the pool holds before computing the rest (scheduler.KVConnector):
- the pool keeps chunks of `chunk_tokens` tokens (LMCache's chunk_size, 256 by default),
  each identified by the chained hash of its prefix (the hash of the chunk's last block,
  cluster.kv.hashing), deduplicated; only full chunks are stored (a request's prompt and
  the outputs it computed: LLMServingSim's figure 7 pool ends with 420 chunks of 32 MiB,
  exactly the distinct full 256-token chunks of the pulse workload's prompts and outputs);
- a lookup finds the request's leading chunks in the pool; the external tokens are what
  it holds beyond the engine's own hit (vLLM's get_num_new_matched_tokens), one token
  fewer when the pool holds the whole prompt (the last token is computed to sample);
- loading them takes latency + tokens * KV bytes per token / bandwidth, inside the
  iteration that admits the request (LMCache loads layer by layer in the forward pass);
- over capacity the least recently stored or hit chunk is evicted.
Stats follow vLLM's external prefix-cache counters: queries (prompt tokens of requests
admitted with the connector) and hits (external tokens).
"""

from __future__ import annotations

from collections import OrderedDict

from cluster.sim.engine_model.sequence import EngineRequest

LMCACHE_CHUNK_TOKENS = 256


class SharedPrefixPool:
    """One pool for every engine that has it as connector (module docstring)."""

    def __init__(
        self,
        capacity_bytes: float,
        bandwidth_bytes_s: float,
        bytes_per_token: int,
        *,
        block_size: int = 16,
        chunk_tokens: int = LMCACHE_CHUNK_TOKENS,
        latency_s: float = 0.0,
    ) -> None:
        if chunk_tokens < block_size or chunk_tokens % block_size:
            raise ValueError(
                f"pool chunks of {chunk_tokens} tokens must be a multiple of the {block_size}-token block"
            )
        if capacity_bytes <= 0 or bandwidth_bytes_s <= 0 or bytes_per_token <= 0:
            raise ValueError("pool capacity, bandwidth and KV bytes per token must be > 0")
        self.chunk_tokens = chunk_tokens
        self.blocks_per_chunk = chunk_tokens // block_size
        self.chunk_bytes = chunk_tokens * bytes_per_token
        self.capacity_chunks = max(int(capacity_bytes // self.chunk_bytes), 1)
        self.bandwidth_bytes_s = bandwidth_bytes_s
        self.bytes_per_token = bytes_per_token
        self.latency_s = latency_s
        self._chunks: OrderedDict[int, None] = OrderedDict()  # LRU: oldest first
        self.queries = self.hits = self.evictions = 0
        self.trace: list[tuple[float, int, int, int]] = []  # t, chunks, queries, hits

    @property
    def stored_chunks(self) -> int:
        return len(self._chunks)

    @property
    def stored_bytes(self) -> int:
        return len(self._chunks) * self.chunk_bytes

    def _chunk_hash(self, req: EngineRequest, j: int) -> int | None:
        last = (j + 1) * self.blocks_per_chunk - 1
        return req.block_hashes[last] if last < len(req.block_hashes) else None

    def lookup(self, req: EngineRequest, local_tokens: int) -> int:
        """External tokens the pool gives `req` beyond its `local_tokens` GPU hit."""
        n = 0
        while (n + 1) * self.chunk_tokens <= req.num_tokens:
            h = self._chunk_hash(req, n)
            if h is None or h not in self._chunks:
                break
            self._chunks.move_to_end(h)
            n += 1
        held = min(n * self.chunk_tokens, req.num_tokens - 1)
        ext = max(held - local_tokens, 0)
        self.queries += req.num_tokens
        self.hits += ext
        return ext

    def load_seconds(self, tokens: int) -> float:
        return self.latency_s + tokens * self.bytes_per_token / self.bandwidth_bytes_s

    def store(self, req: EngineRequest, t: float) -> None:
        """Store the chunks of `req` whose tokens are all computed by now."""
        full = req.computed_tokens // self.chunk_tokens
        changed = False
        for j in range(full):
            h = self._chunk_hash(req, j)
            if h is None:
                break
            if h in self._chunks:
                continue
            self._chunks[h] = None
            changed = True
            if len(self._chunks) > self.capacity_chunks:
                self._chunks.popitem(last=False)
                self.evictions += 1
        if changed:
            self.record(t)

    def record(self, t: float) -> None:
        self.trace.append((t, len(self._chunks), self.queries, self.hits))
