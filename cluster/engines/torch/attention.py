"""Paged attention over the KV pool for one forward pass (paper 000 §5.1, Eq. 1's A term).

A pass holds the new tokens of several requests, flattened. `PassLayout` is built once per
pass from each request's slice (its new tokens, the tokens already in its pages, its page
table) and serves every layer: where the new K/V go (`write_slots`, flat slots of the
[pages * page_size] view of a layer's pool) and how queries attend.

Decode requests (one new token each) are attended together: their contexts are gathered
into a [B, L_max] block of slots with a padding mask, one SDPA call per layer. Prefill
chunks are attended one request at a time, so the work is exactly the query–key pairs
A = t_uc·t_c + t_uc(t_uc + 1)/2 of Eq. 1 rather than a padded rectangle; the i-th new token
sees the t_c earlier tokens and the first i new ones. `dense_attention` is the unpaged
reference the tests compare against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True, slots=True)
class SeqSlice:
    """One request's part of a pass: `num_new` tokens after `num_cached` in `pages`."""

    num_new: int
    num_cached: int
    pages: Sequence[int]  # page ids covering num_cached + num_new tokens

    @property
    def attn_pairs(self) -> int:
        """Query–key pairs of causal attention: t_uc·t_c + t_uc(t_uc + 1)/2."""
        return self.num_new * self.num_cached + self.num_new * (self.num_new + 1) // 2


def _slots(pages: Sequence[int], start: int, stop: int, page_size: int) -> list[int]:
    return [pages[p // page_size] * page_size + p % page_size for p in range(start, stop)]


class PassLayout:
    """Write slots and attention plan of one pass (see module docstring)."""

    def __init__(self, seqs: Sequence[SeqSlice], page_size: int, device: torch.device) -> None:
        self.seqs = list(seqs)
        write: list[int] = []
        starts: list[int] = []
        pos = 0
        for s in self.seqs:
            starts.append(pos)
            write += _slots(s.pages, s.num_cached, s.num_cached + s.num_new, page_size)
            pos += s.num_new
        self.num_tokens = pos
        self.write_slots = torch.tensor(write, dtype=torch.long, device=device)
        positions = [p for s in self.seqs for p in range(s.num_cached, s.num_cached + s.num_new)]
        self.positions = torch.tensor(positions, dtype=torch.long, device=device)
        # Decode group: every single-token slice, attended in one padded call.
        dec = [i for i, s in enumerate(self.seqs) if s.num_new == 1]
        self.decode_rows: torch.Tensor | None = None
        if dec:
            ctx = [self.seqs[i].num_cached + 1 for i in dec]
            width = max(ctx)
            rows = []
            for i, n in zip(dec, ctx, strict=True):
                slots = _slots(self.seqs[i].pages, 0, n, page_size)
                rows.append(slots + [slots[0]] * (width - n))
            self.decode_rows = torch.tensor([starts[i] for i in dec], device=device)
            self.decode_slots = torch.tensor(rows, dtype=torch.long, device=device)
            lengths = torch.tensor(ctx, device=device)
            self.decode_mask = (torch.arange(width, device=device)[None, :] < lengths[:, None])[
                :, None, None, :
            ]
        # Prefill chunks: one call each, with the causal mask shifted by t_c.
        self.prefill: list[tuple[int, int, torch.Tensor, torch.Tensor | None]] = []
        for i, s in enumerate(self.seqs):
            if s.num_new == 1:
                continue
            total = s.num_cached + s.num_new
            ctx_slots = torch.tensor(_slots(s.pages, 0, total, page_size), device=device)
            mask = None
            if s.num_cached:
                q_pos = torch.arange(s.num_cached, total, device=device)
                mask = torch.arange(total, device=device)[None, :] <= q_pos[:, None]
            self.prefill.append((starts[i], s.num_new, ctx_slots, mask))

    @property
    def attn_pairs(self) -> int:
        return sum(s.attn_pairs for s in self.seqs)

    def attend(self, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor) -> torch.Tensor:
        """q [T, H, hd]; k_pool, v_pool [slots, KVH, hd] of one layer -> [T, H, hd]."""
        out = torch.empty_like(q)
        if self.decode_rows is not None:
            qd = q[self.decode_rows].unsqueeze(2)  # [B, H, 1, hd]
            kd = k_pool[self.decode_slots].transpose(1, 2)  # [B, KVH, L, hd]
            vd = v_pool[self.decode_slots].transpose(1, 2)
            o = F.scaled_dot_product_attention(
                qd, kd, vd, attn_mask=self.decode_mask, enable_gqa=True
            )
            out[self.decode_rows] = o.squeeze(2)
        for start, n, slots, mask in self.prefill:
            qp = q[start : start + n].transpose(0, 1).unsqueeze(0)  # [1, H, n, hd]
            kp = k_pool[slots].transpose(0, 1).unsqueeze(0)  # [1, KVH, ctx, hd]
            vp = v_pool[slots].transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(
                qp, kp, vp, attn_mask=mask, is_causal=mask is None, enable_gqa=True
            )
            out[start : start + n] = o[0].transpose(0, 1)
        return out


def dense_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_cached: int = 0
) -> torch.Tensor:
    """Reference causal attention without pages or SDPA: q [n, H, hd], k/v [ctx, KVH, hd].

    Query i sits at position num_cached + i and sees keys 0..num_cached + i.
    """
    n, heads, hd = q.shape
    ctx, kv_heads, _ = k.shape
    rep = heads // kv_heads
    kk = k.repeat_interleave(rep, dim=1).transpose(0, 1)  # [H, ctx, hd]
    vv = v.repeat_interleave(rep, dim=1).transpose(0, 1)
    scores = q.transpose(0, 1) @ kk.transpose(1, 2) / hd**0.5  # [H, n, ctx]
    q_pos = torch.arange(num_cached, num_cached + n)[:, None]
    scores = scores.masked_fill(torch.arange(ctx)[None, :] > q_pos, float("-inf"))
    return (scores.softmax(-1) @ vv).transpose(0, 1)
