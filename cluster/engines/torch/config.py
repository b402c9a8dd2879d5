"""Shapes of the torch engine: model presets and engine settings (SPEC §9).

A `ModelConfig` is a decoder-only transformer (RMSNorm, RoPE, grouped-query attention, and
an MoE FFN — top-k of E experts, softmax over the router then top-k renormalized as in
Qwen/Mixtral — or a dense SwiGLU FFN). Token ids 0..255 are the bytes of the toy tokenizer
(`cluster.wire.toy_tokenizer`); ids up to `vocab_size` are valid inputs, and
`eos_token_id` (256) ends a generation unless the request sets ignore_eos.

`EngineConfig` is what shapes latency and memory on one node: page size, GPU (L1) and host
(L2) KV capacity in pages, the per-pass token budget of chunked prefill, the running-request
cap, the eviction policy, the device and its torch threads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cluster.core import ConfigError
from cluster.kv.eviction import EVICTION_POLICIES

DEVICES = ("cpu", "cuda")
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """One transformer shape; `num_experts == 0` means a dense FFN of `ffn_dim`."""

    name: str
    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    ffn_dim: int  # dense FFN width, or each expert's width in an MoE layer
    num_experts: int = 0
    top_k: int = 0
    rope_theta: float = 10_000.0
    rms_eps: float = 1e-6
    eos_token_id: int = 256
    max_context_tokens: int = 32_768

    def __post_init__(self) -> None:
        if min(self.vocab_size, self.d_model, self.num_layers, self.num_heads) <= 0:
            raise ConfigError(f"model {self.name}: sizes must be > 0")
        if self.d_model % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"model {self.name}: d_model must divide into num_heads and num_heads into "
                f"num_kv_heads, got {self.d_model}/{self.num_heads}/{self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise ConfigError(
                f"model {self.name}: RoPE needs an even head_dim, got {self.head_dim}"
            )
        if self.num_experts < 0 or (self.num_experts and not 0 < self.top_k <= self.num_experts):
            raise ConfigError(
                f"model {self.name}: need 1 <= top_k <= num_experts or num_experts = 0 (dense), "
                f"got top_k={self.top_k}, num_experts={self.num_experts}"
            )
        if self.vocab_size <= 256 or not 0 <= self.eos_token_id < self.vocab_size:
            raise ConfigError(
                f"model {self.name}: vocab_size must exceed the 256 byte tokens and hold "
                f"eos_token_id, got vocab_size={self.vocab_size}, eos={self.eos_token_id}"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers, in float32 (halve for 16-bit dtypes)."""
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * 4

    def num_parameters(self) -> int:
        """Parameters of `model.Transformer` built from this config (untied embeddings)."""
        d, hd = self.d_model, self.head_dim
        attn = d * self.num_heads * hd * 2 + d * self.num_kv_heads * hd * 2
        ffn = 3 * d * self.ffn_dim
        if self.is_moe:
            ffn = self.num_experts * ffn + d * self.num_experts  # experts + router
        per_layer = attn + ffn + 2 * d  # two RMSNorm weights
        return self.num_layers * per_layer + 2 * self.vocab_size * d + d

    def hf_config(self) -> dict[str, object]:
        """This shape as a Hugging Face config.json (what `pdlab profile import` and
        cluster.hardware.model_shape read); float32 weights, untied embeddings."""
        doc: dict[str, object] = {
            "_name_or_path": f"pdlab/{self.name}", "architectures": ["PdlabTorchForCausalLM"],
            "model_type": "pdlab_torch_moe" if self.is_moe else "pdlab_torch",
            "hidden_size": self.d_model, "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim, "intermediate_size": self.ffn_dim,
            "vocab_size": self.vocab_size, "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_eps, "max_position_embeddings": self.max_context_tokens,
            "eos_token_id": self.eos_token_id, "tie_word_embeddings": False,
            "torch_dtype": "float32",
        }  # fmt: skip
        if self.is_moe:
            doc |= {"num_experts": self.num_experts, "num_experts_per_tok": self.top_k,
                    "moe_intermediate_size": self.ffn_dim, "norm_topk_prob": True}  # fmt: skip
        return doc

    def active_parameters(self) -> int:
        """Parameters one token uses (top_k experts of each MoE layer)."""
        if not self.is_moe:
            return self.num_parameters()
        unused = (self.num_experts - self.top_k) * 3 * self.d_model * self.ffn_dim
        return self.num_parameters() - self.num_layers * unused


PRESETS: dict[str, ModelConfig] = {
    # Interactive on one CPU core: ~1 M multiply-adds per token.
    "tiny-moe": ModelConfig(
        "tiny-moe", vocab_size=512, d_model=128, num_layers=4, num_heads=4, num_kv_heads=2,
        ffn_dim=256, num_experts=16, top_k=2,
    ),
    "small-moe": ModelConfig(
        "small-moe", vocab_size=4096, d_model=384, num_layers=6, num_heads=6, num_kv_heads=2,
        ffn_dim=384, num_experts=32, top_k=4,
    ),
    "small-dense": ModelConfig(
        "small-dense", vocab_size=4096, d_model=384, num_layers=6, num_heads=6, num_kv_heads=2,
        ffn_dim=1536,
    ),
}  # fmt: skip


def preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(
            f"unknown model preset {name!r}; choose one of: {', '.join(PRESETS)}"
        ) from None


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """One engine node: KV pool, budgets, eviction, device (see module docstring)."""

    model: ModelConfig = PRESETS["tiny-moe"]
    seed: int = 0
    page_size: int = 16
    gpu_pages: int = 1024  # L1: the device's KV pool
    host_pages: int = 4096  # L2: host memory, written through (0 = no host tier)
    chunk_tokens: int = 512  # per-pass token budget of chunked prefill
    max_running: int = 64
    eviction: str = "lru"
    device: str = "cpu"
    dtype: str = "float32"
    num_threads: int = 1  # torch intra-op threads on CPU
    telemetry: bool = True  # time passes, publish FPM (False: the bench's baseline)
    worker_id: str = ""

    def __post_init__(self) -> None:
        if self.page_size <= 0 or self.gpu_pages <= 0 or self.host_pages < 0:
            raise ConfigError(
                "page_size and gpu_pages must be > 0 and host_pages >= 0, got "
                f"{self.page_size}, {self.gpu_pages}, {self.host_pages}"
            )
        if self.chunk_tokens < self.page_size or self.max_running <= 0:
            raise ConfigError(
                f"chunk_tokens must be >= page_size ({self.page_size}) and max_running > 0, "
                f"got {self.chunk_tokens}, {self.max_running}"
            )
        if self.eviction not in EVICTION_POLICIES:
            raise ConfigError(
                f"unknown eviction policy {self.eviction!r}; choose one of: "
                f"{', '.join(EVICTION_POLICIES.names())}"
            )
        if self.device.split(":")[0] not in DEVICES:
            raise ConfigError(f"device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.num_threads <= 0:
            raise ConfigError(f"num_threads must be > 0, got {self.num_threads}")

    @property
    def max_pages_per_request(self) -> int:
        return math.ceil(self.model.max_context_tokens / self.page_size)
