"""The engine's decoder-only transformer in torch (SPEC §9; φ(B) of paper 000 §5.1, Eq. 2).

Pre-norm blocks: RMSNorm -> grouped-query attention with RoPE (rotate-half) -> residual,
RMSNorm -> FFN -> residual; a final RMSNorm and an untied LM head. The FFN is dense SwiGLU
or an MoE layer: a router's softmax over E experts, the top-k renormalized to sum to one
(Qwen's norm_topk_prob; equal to Mixtral's softmax over the top-k logits), each token's
output the weighted sum of its experts' SwiGLU outputs. Tokens are grouped by expert and
each activated expert runs once per pass, so an MoE layer's cost grows with the number of
distinct experts the pass activates — the quantity φ(B) = 1 − (1 − k/E)^(t_fwd·B) models
as a fraction of E. `forward` reports that number per layer.

Weights are random, drawn from a seeded CPU generator (the same on any device); no
downloads. `forward` runs a flattened batch against the paged KV pool through an
`attention.PassLayout`; `dense_logits` is the unpaged reference (tests).

Under expert parallelism (`shard_experts`) each MoE layer keeps only its EP rank's slice of
the experts and runs through the group's dispatch/combine (`expert_parallel`);
`dummy_forward` is the one-token pass an idle DP rank runs so that the group's collectives
line up (vLLM's `execute_dummy_batch`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from cluster.engines.torch.attention import PassLayout, dense_attention
from cluster.engines.torch.config import ModelConfig
from cluster.engines.torch.expert_parallel import (
    EPComm,
    ExpertPlacement,
    check_transport,
    ep_moe_forward,
)

# (layer, q [T, H, hd], k and v [T, KVH, hd]) -> attention output [T, H, hd]
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


class Rope:
    """Rotary position embedding tables (rotate-half layout, as Llama/Qwen)."""

    def __init__(self, head_dim: int, max_positions: int, theta: float, device: torch.device):
        inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv)
        self.cos = freqs.cos().float().to(device)
        self.sin = freqs.sin().float().to(device)

    def __call__(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos = self.cos[positions][:, None, :]  # [T, 1, hd/2]
        sin = self.sin[positions][:, None, :]
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.d_model, cfg.num_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.d_model, bias=False)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, rope: Rope, layer: int, attend: Attend
    ) -> torch.Tensor:
        t = x.shape[0]
        q = rope(self.wq(x).view(t, self.heads, self.head_dim), positions)
        k = rope(self.wk(x).view(t, self.kv_heads, self.head_dim), positions)
        v = self.wv(x).view(t, self.kv_heads, self.head_dim)
        return self.wo(attend(layer, q, k, v).reshape(t, -1))


class DenseFFN(nn.Module):
    def __init__(self, d: int, ffn: int) -> None:
        super().__init__()
        self.gate = nn.Linear(d, ffn, bias=False)
        self.up = nn.Linear(d, ffn, bias=False)
        self.down = nn.Linear(ffn, d, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int | None]:
        return self.down(F.silu(self.gate(x)) * self.up(x)), None


class MoEFFN(nn.Module):
    """Top-k of E SwiGLU experts; returns the output and the number of experts it ran."""

    def __init__(self, d: int, ffn: int, num_experts: int, top_k: int) -> None:
        super().__init__()
        self.top_k = top_k
        self.num_experts = num_experts
        self.router = nn.Linear(d, num_experts, bias=False)
        self.w_gate = nn.Parameter(torch.empty(num_experts, d, ffn))
        self.w_up = nn.Parameter(torch.empty(num_experts, d, ffn))
        self.w_down = nn.Parameter(torch.empty(num_experts, ffn, d))
        self.comm: EPComm | None = None  # set by `shard`: this rank's experts only

    def shard(self, comm: EPComm) -> None:
        """Keep only the experts `comm.placement` gives this rank; route through `comm`."""
        first, n = comm.placement.first, comm.placement.per_rank
        for name in ("w_gate", "w_up", "w_down"):
            w = getattr(self, name)
            setattr(self, name, nn.Parameter(w[first : first + n].clone(), requires_grad=False))
        self.comm = comm

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int | None]:
        if self.comm is not None:
            return ep_moe_forward(self, x, self.comm)
        probs = self.router(x).float().softmax(-1)
        weight, expert = probs.topk(self.top_k, dim=-1)  # [T, k]
        weight = (weight / weight.sum(-1, keepdim=True)).to(x.dtype)
        flat = expert.flatten()
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        token = order // self.top_k
        out = torch.zeros_like(x)
        start = 0
        active = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            active += 1
            rows = token[start : start + n]
            xs = x[rows]
            y = (F.silu(xs @ self.w_gate[e]) * (xs @ self.w_up[e])) @ self.w_down[e]
            out.index_add_(0, rows, y * weight.flatten()[order[start : start + n], None])
            start += n
        return out, active


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.rms_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.rms_eps)
        self.ffn: nn.Module = (
            MoEFFN(cfg.d_model, cfg.ffn_dim, cfg.num_experts, cfg.top_k)
            if cfg.is_moe
            else DenseFFN(cfg.d_model, cfg.ffn_dim)
        )


class Transformer(nn.Module):
    """The model; `forward` returns logits of the requested rows and experts per MoE layer."""

    def __init__(
        self,
        cfg: ModelConfig,
        *,
        seed: int = 0,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        with torch.device(device):  # built in place ("meta": shapes only, no memory)
            self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
            self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
            self.norm = RMSNorm(cfg.d_model, cfg.rms_eps)
            self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if torch.device(device).type != "meta":
            self._init_weights(seed)
        self.to(dtype=dtype)
        self.requires_grad_(False)
        self.rope = Rope(cfg.head_dim, cfg.max_context_tokens, cfg.rope_theta, torch.device(device))

    @torch.no_grad()
    def _init_weights(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name == "embed.weight":
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-2] if p.dim() == 3 else p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        layout: PassLayout,
        kv_write: Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
        logit_rows: torch.Tensor,
    ) -> tuple[torch.Tensor, list[int]]:
        """One pass. `kv_write(layer, k, v)` stores the new K/V and returns the layer's pool
        views [slots, KVH, hd]; returns logits [len(logit_rows), V] and experts per layer."""

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            k_pool, v_pool = kv_write(layer, k, v)
            return layout.attend(q, k_pool, v_pool)

        return self._run(tokens, layout.positions, attend, logit_rows)

    def shard_experts(self, comm: EPComm) -> None:
        """Expert parallelism: every MoE layer keeps this rank's experts (module doc)."""
        if not self.cfg.is_moe:
            raise ValueError(f"model {self.cfg.name} is dense: there are no experts to split")
        check_transport(self.cfg.num_experts, self.embed.weight.dtype)
        for module in self.blocks:
            cast(MoEFFN, cast(Block, module).ffn).shard(comm)

    @property
    def placement(self) -> ExpertPlacement | None:
        ffn = cast(Block, self.blocks[0]).ffn
        comm = ffn.comm if isinstance(ffn, MoEFFN) else None
        return None if comm is None else comm.placement

    @torch.inference_mode()
    def dummy_forward(self, num_tokens: int = 1) -> list[int]:
        """Token id 0 at position 0 through every layer, attending to itself, no KV
        written, no logits: an idle DP rank's part of the group's collectives (one token;
        more to time the collectives between layers of a given size)."""
        device = self.embed.weight.device

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            # One key: the softmax is 1, each query head gets its KV head's value.
            return v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)

        zero = torch.zeros(num_tokens, dtype=torch.long, device=device)
        return self._run(zero, zero, attend, zero[:0])[1]

    @torch.inference_mode()
    def dense_logits(self, tokens: list[int]) -> torch.Tensor:
        """Logits of every position of one sequence, unpaged (the tests' reference)."""
        device = self.embed.weight.device

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return dense_attention(q, k, v)

        ids = torch.tensor(tokens, device=device)
        rows = torch.arange(len(tokens), device=device)
        return self._run(ids, torch.arange(len(tokens), device=device), attend, rows)[0]

    def _run(
        self, tokens: torch.Tensor, positions: torch.Tensor, attend: Attend, rows: torch.Tensor
    ) -> tuple[torch.Tensor, list[int]]:
        h = self.embed(tokens)
        experts: list[int] = []
        for i, module in enumerate(self.blocks):
            block = cast(Block, module)
            h = h + block.attn(block.attn_norm(h), positions, self.rope, i, attend)
            y, active = block.ffn(block.ffn_norm(h))
            h = h + y
            if active is not None:
                experts.append(active)
        return self.lm_head(self.norm(h[rows])).float(), experts
