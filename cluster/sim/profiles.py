"""Hardware profiles: ground truth for simulated iteration times (paper 000 §5.1, App. B).

A profile gives the coefficients of Eq. 1 and Eq. 2 *plus effects the fitted models omit*:
a decode context-length term (App. B.4: ~1 ms per million context tokens on GB300, ~1.5 ms
on H200) and multiplicative noise, so fitting the simulator's own logs is honest rather than
circular. It also sets the MoE shape (k of E experts), speculative decoding (t_fwd fed,
t_acc accepted per request per iteration), KV capacities (L1 GPU, L2 host = 4x L1 by default)
in tokens, the prefill chunk and the block size.

Presets:
- `gb300` - GLM-5.2-class MoE on 4x GB300 (TP4, NVFP4, FP8 KV, MTP): decode iteration
  17-45 ms at 8-64 running requests (Fig. 5d), prefill linear in uncached tokens and in the
  cached prefix (Fig. 5a/b), 2.06M GPU / 8.25M host KV tokens per node (App. D.5).
- `gb300-kimi` - Kimi-K2.6-class MoE on 4x GB300 (k=8 of E=384, MLA full attention: far
  costlier per query-key pair than GLM-5.2's sparse attention); paper 000 serves OSWorld and
  the shifting workload with it.
- `h200` - DeepSeek-V4-Flash-class MoE on 4x H200 (TP4): k=6 of E=256, t_fwd=6 (App. B.1),
  compressed attention (cheaper per query-key pair), 1.5 ms per million context tokens.
A JSON file from `pdlab fit --json` is accepted as a profile: its nodes' fitted coefficients
become the ground truth (averaged over nodes), with the base preset's other fields.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from cluster.core import ConfigError
from models import DecodeModel, NodeModel, PrefillModel, phi


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    name: str
    prefill: tuple[float, float, float, float]  # c0..c3 (s, s/token, s/pair, s/token)
    decode: tuple[float, float, float]  # d0..d2 (s, s, s/request)
    top_k: int
    num_experts: int
    t_fwd: float
    t_acc: float
    decode_ctx_s_per_token: float  # omitted by Eq. 2 (App. B.4)
    noise: float  # multiplicative sigma of iteration times
    l1_tokens: int
    l2_tokens: int
    chunk_tokens: int = 8192
    block_tokens: int = 256
    max_decode_batch: int = 256
    transfer_s_per_token: float = 1.1e-6  # P->D KV transfer (54.6 KB/token at ~50 GB/s)
    transfer_base_s: float = 0.002
    # Actual time to fetch KV from a peer's host memory over RDMA (App. D.6: 54.6 KB per token
    # at ~52 GB/s; median 7 ms below 16K tokens, 129 ms for 64K-128K). The router's tau(x)
    # (0.45 s + 1 us/token) is a deliberately conservative charge, not this duration.
    fetch_base_s: float = 0.005
    fetch_s_per_token: float = 1.05e-6
    hardware: str = ""

    def __post_init__(self) -> None:
        if any(c < 0 for c in (*self.prefill, *self.decode)):
            raise ConfigError(f"profile {self.name}: coefficients must be >= 0")
        if self.l1_tokens <= 0 or self.l2_tokens <= 0:
            raise ConfigError(f"profile {self.name}: KV capacities must be > 0")
        if self.chunk_tokens <= 0 or self.block_tokens <= 0:
            raise ConfigError(f"profile {self.name}: chunk and block sizes must be > 0")
        if self.t_acc <= 0 or self.t_fwd <= 0 or self.t_acc > self.t_fwd:
            raise ConfigError(f"profile {self.name}: need 0 < t_acc <= t_fwd")

    def fetch_time(self, tokens: float) -> float:
        """Seconds to pull `tokens` of KV from a peer's host memory into this node's GPUs."""
        return self.fetch_base_s + self.fetch_s_per_token * tokens if tokens > 0 else 0.0

    def node_model(self) -> NodeModel:
        """The profile's coefficients as a model (what a perfect fit would give)."""
        return NodeModel(
            PrefillModel.from_coef(self.prefill),
            DecodeModel.from_coef(self.decode, self.top_k, self.num_experts, self.t_fwd),
            mean_new_tokens=float(self.chunk_tokens),
            restore_fraction=0.0,
        )

    def prefill_time(self, sum_t_uc: float, sum_attn_pairs: float, sum_t_rst: float) -> float:
        c0, c1, c2, c3 = self.prefill
        return c0 + c1 * sum_t_uc + c2 * sum_attn_pairs + c3 * sum_t_rst

    def decode_times(self, batch_size: int, ctx_tokens: np.ndarray) -> np.ndarray:
        """Ground-truth decode iteration times for a batch at each iteration's total context."""
        d0, d1, d2 = self.decode
        base = (
            d0
            + d1 * float(phi(batch_size, self.top_k, self.num_experts, self.t_fwd))
            + d2 * batch_size
        )
        return base + self.decode_ctx_s_per_token * ctx_tokens


PRESETS: dict[str, HardwareProfile] = {
    "gb300": HardwareProfile(
        name="gb300",
        prefill=(0.030, 8.0e-5, 4.0e-10, 3.0e-7),
        decode=(0.012, 0.015, 2.8e-4),
        top_k=8,
        num_experts=256,
        t_fwd=2.0,
        t_acc=1.7,
        decode_ctx_s_per_token=1.0e-9,
        noise=0.03,
        l1_tokens=2_060_000,
        l2_tokens=8_250_000,
        hardware="4xGB300 (GLM-5.2-class MoE, TP4)",
    ),
    "gb300-kimi": HardwareProfile(
        name="gb300-kimi",
        prefill=(0.030, 7.0e-5, 1.2e-9, 3.0e-7),
        decode=(0.011, 0.016, 2.6e-4),
        top_k=8,
        num_experts=384,
        t_fwd=2.0,
        t_acc=1.7,
        decode_ctx_s_per_token=1.5e-9,
        noise=0.03,
        l1_tokens=2_900_000,
        l2_tokens=11_600_000,
        hardware="4xGB300 (Kimi-K2.6-class MoE, MLA, TP4)",
    ),
    "h200": HardwareProfile(
        name="h200",
        prefill=(0.025, 4.5e-5, 5.0e-11, 3.0e-7),
        decode=(0.015, 0.020, 4.0e-4),
        top_k=6,
        num_experts=256,
        t_fwd=6.0,
        t_acc=3.2,
        decode_ctx_s_per_token=1.5e-9,
        noise=0.03,
        l1_tokens=1_000_000,
        l2_tokens=4_000_000,
        hardware="4xH200 (DeepSeek-V4-Flash-class MoE, TP4)",
    ),
}


def load_profile(spec: str, *, base: str = "gb300") -> HardwareProfile:
    """A preset name, or a path to a `pdlab fit --json` file (coefficients on `base`)."""
    if spec in PRESETS:
        return PRESETS[spec]
    path = Path(spec)
    if not path.exists():
        raise ConfigError(
            f"unknown profile {spec!r}: use one of {', '.join(PRESETS)} or a path to a fit JSON"
        )
    try:
        doc = json.loads(path.read_text())
        nodes = [
            n
            for n in doc["nodes"]
            if n.get("prefill", {}).get("coef") and n.get("decode", {}).get("coef")
        ]
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path}: not a `pdlab fit --json` document ({e})") from None
    if not nodes:
        raise ConfigError(f"{path}: no node has both prefill and decode coefficients")
    pre = np.mean([n["prefill"]["coef"] for n in nodes], axis=0)
    dec = np.mean([n["decode"]["coef"] for n in nodes], axis=0)
    b = PRESETS[base]
    top_k = int(nodes[0].get("moe_top_k", b.top_k))
    experts = int(nodes[0].get("moe_experts", b.num_experts))
    return replace(
        b,
        name=f"fit:{path.name}",
        prefill=tuple(float(x) for x in pre),  # type: ignore[arg-type]
        decode=tuple(float(x) for x in dec),  # type: ignore[arg-type]
        top_k=top_k,
        num_experts=experts,
    )
