"""vLLM's KV event structs, re-declared for tests (vLLM itself needs CUDA torch).

Mirrors `vllm/distributed/kv_events.py` of vllm-project/vllm at commit 0181ea3173e5 (main,
2026): the msgspec struct configurations (`EventBatch`: `omit_defaults`, `gc=False`, a
*map*; `KVCacheEvent`: `omit_defaults`, `gc=False`, `tag=True`, so each event is a map
tagged "type": <class name>), field names, order, types and defaults, `ExternalBlockHash =
bytes | int` (`vllm/v1/core/kv_cache_utils.py`) and its int form under
VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES (`maybe_convert_block_hash`: the big-endian int of the
digest, low 64 bits). `ArrayEventBatch` is the batch of releases whose `EventBatch` was
`array_like=True` (0.9-0.11). vLLM's publisher encodes with `msgspec.msgpack.Encoder()` and
sends [topic, seq.to_bytes(8, "big"), payload], seq from 0.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

ExternalBlockHash = bytes | int


class EventBatch(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class ArrayEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base class for all KV cache-related events"""


MEDIUM_GPU = "GPU"


class BlockStored(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


class ArrayKVEventBatch(ArrayEventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


def block_hash(parent: bytes | None, tokens: list[int]) -> bytes:
    """A sha256 chained block hash (vLLM's default hash function family; any digest works)."""
    return hashlib.sha256(repr((parent, tuple(tokens))).encode()).digest()


def as_int_hash(h: bytes) -> int:
    """`maybe_convert_block_hash` under VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES."""
    return int.from_bytes(h, byteorder="big") & ((1 << 64) - 1)
