"""One generation request inside the torch engine: tokens, pages and progress (SPEC §9).

A request's page table (`pages`) covers the tokens whose K/V are computed (`num_computed`);
page i is either a cached block it references (`blocks[i]`) or a private page of its own
(`blocks[i] is None`: a partial page, or a full page another request cached first).
`hashes` are the chained block hashes (`cluster.kv.hashing.chain`) of its full pages so far.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from cluster.core import BlockHash
from cluster.engines.shell.scheduling import OnUpdate
from cluster.engines.shell.stamps import Stamps
from cluster.engines.torch.prefix_cache import Block
from cluster.kv.hashing import ROOT_HASH, chain


@dataclass(frozen=True, slots=True)
class TransferredKV:
    """What a decode engine received from the prefill engine of a bootstrap room."""

    kv: torch.Tensor  # [layers, 2, pages, page_size, kv_heads, head_dim] on the CPU
    first_token_id: int
    cached_tokens: int  # the prefill's prefix hit, reported back as meta_info.cached_tokens


@dataclass(slots=True, eq=False)
class EngineRequest:
    rid: str
    input_ids: list[int]
    max_new_tokens: int
    on_update: OnUpdate
    ignore_eos: bool = False
    temperature: float = 0.0
    bootstrap_room: int | None = None
    transfer: TransferredKV | None = None
    record_logits: bool = False  # keep each sampled token's logits (tests)
    stamps: Stamps = field(default_factory=dict)  # stage times (cluster.engines.shell.stamps)
    output_ids: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)
    blocks: list[Block | None] = field(default_factory=list)
    hashes: list[BlockHash] = field(default_factory=list)
    num_computed: int = 0
    cached_tokens: int = 0
    restored_tokens: int = 0  # restored from the host tier before the first chunk
    pending_restore_tokens: int = 0  # counted as t_rst in the next prefill pass
    reserved_pages: int = 0
    admitted: bool = False
    logits: list[torch.Tensor] = field(default_factory=list)

    @property
    def tokens(self) -> list[int]:
        return self.input_ids + self.output_ids

    @property
    def prefill_done(self) -> bool:
        return self.num_computed >= len(self.input_ids)

    def extend_hashes(self, page_size: int) -> None:
        """Hash the full pages of the computed tokens not hashed yet."""
        toks = self.tokens
        while (len(self.hashes) + 1) * page_size <= self.num_computed:
            i = len(self.hashes)
            parent = self.hashes[-1] if self.hashes else ROOT_HASH
            self.hashes.append(chain(parent, tuple(toks[i * page_size : (i + 1) * page_size])))

    def held_blocks(self) -> list[Block]:
        return [b for b in self.blocks if b is not None]

    def private_pages(self) -> list[int]:
        return [p for p, b in zip(self.pages, self.blocks, strict=True) if b is None]
