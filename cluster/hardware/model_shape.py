"""A model's shape from its Hugging Face config: KV bytes per token and weight bytes.

What GPU memory a served model needs (SPEC §9: KV capacity from GPU memory): weights per
rank and KV cache bytes per token per rank under tensor parallelism (TP) and expert
parallelism (EP), and the MoE shape (k of E routed experts, paper 000 App. B.3) that phi(B)
needs. Read from the config fields the common families use (Llama, Qwen2/3, Qwen3-MoE,
Mixtral, DeepSeek-V2/V3 with MLA); a missing required field is an error naming the file
and the field.

Per rank, under TP t and EP e:
- attention and dense-MLP weights split t ways; routed experts split e ways (each expert
  then also t ways inside an EP group of size e < t*dp is not modelled: EP replaces TP for
  experts, as vLLM's --enable-expert-parallel does); norms are replicated; embedding and
  lm_head split t ways (vocab-parallel).
- KV heads split t ways, replicated when t exceeds them (at least one head per rank); an
  MLA cache (kv_lora_rank + qk_rope_head_dim per token and layer) is replicated on every
  rank.
`sliding_window` is the config's attention window (0: none; a config with
`use_sliding_window: false`, as Qwen2/3 write, has none: vLLM's ModelConfig reads it the
same way). It changes which attention kernel a decode runs (cluster.hardware.attention_kernel).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster import size_limits as limits
from cluster.core import ConfigError
from cluster.input_files import load_json_document

# Each dimension's ceiling; HF config names in messages where they differ from ours.
_DIMENSIONS = (
    ("num_layers", limits.LAYERS),
    ("hidden_size", limits.HIDDEN_SIZE),
    ("num_heads", limits.HEADS),
    ("num_kv_heads", limits.HEADS),
    ("head_dim", limits.HEAD_DIM),
    ("intermediate_size", limits.INTERMEDIATE_SIZE),
    ("vocab_size", limits.VOCAB_SIZE),
    ("num_experts", limits.EXPERTS),
    ("top_k", limits.EXPERTS),
    ("moe_intermediate_size", limits.Limit(0, limits.INTERMEDIATE_SIZE.hi)),
    ("num_shared_experts", limits.EXPERTS),
    ("shared_expert_intermediate_size", limits.Limit(0, limits.INTERMEDIATE_SIZE.hi)),
    ("num_dense_layers", limits.Limit(0, limits.LAYERS.hi)),
    ("kv_lora_rank", limits.LATENT_DIM),
    ("qk_rope_head_dim", limits.LATENT_DIM),
)
_HF_NAMES = {
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "top_k": "num_experts_per_tok",
}


def _field_name(name: str) -> str:
    hf = _HF_NAMES.get(name)
    return f"field {name!r} ({hf} in a HF config)" if hf else f"field {name!r}"


DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "fp8": 1,
    "float8_e4m3fn": 1,
    "int8": 1,
}


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The dimensions of a decoder-only transformer that set its memory and MoE shape."""

    name: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    num_experts: int = 0  # routed experts E (0 = dense)
    top_k: int = 0  # experts per token k
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0
    num_dense_layers: int = 0  # leading layers with a dense MLP in an MoE model
    kv_lora_rank: int = 0  # MLA latent (0 = per-head K and V)
    qk_rope_head_dim: int = 0
    dtype_bytes: int = 2
    sliding_window: int = 0  # attention window in tokens (0 = full attention)

    def __post_init__(self) -> None:
        """Every dimension within its ceiling (cluster.size_limits) and consistent: at least
        one KV head and no more than there are heads, top-k within the experts; so KV bytes
        per token and weights are positive and a config claiming 1e9 layers is refused."""
        for name, limit in _DIMENSIONS:
            limits.check(_field_name(name), getattr(self, name), limit)
        if self.num_kv_heads > self.num_heads:
            raise ConfigError(
                f"{_field_name('num_kv_heads')} must be at most {_field_name('num_heads')} "
                f"= {self.num_heads}, got {self.num_kv_heads}"
            )
        if self.num_experts and not 1 <= self.top_k <= self.num_experts:
            raise ConfigError(
                f"{_field_name('top_k')} must be in 1..{self.num_experts} (the routed experts), "
                f"got {self.top_k}"
            )
        if not self.num_experts and self.top_k:
            raise ConfigError(
                f"{_field_name('top_k')} is {self.top_k} but the model has no experts"
            )
        if self.num_dense_layers > self.num_layers:
            raise ConfigError(
                f"num_dense_layers must be at most num_layers = {self.num_layers}, "
                f"got {self.num_dense_layers}"
            )
        if self.dtype_bytes not in (1, 2, 4):
            raise ConfigError(f"dtype_bytes must be 1, 2 or 4, got {self.dtype_bytes!r}")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    def kv_bytes_per_token(self, tp: int = 1, kv_dtype_bytes: int | None = None) -> int:
        """KV cache bytes one token occupies on one rank (all layers, K and V)."""
        b = self.dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
        if self.kv_lora_rank:
            return self.num_layers * (self.kv_lora_rank + self.qk_rope_head_dim) * b
        heads = max(1, math.ceil(self.num_kv_heads / max(tp, 1)))
        return 2 * self.num_layers * heads * self.head_dim * b

    def kv_bytes_per_token_total(self, kv_dtype_bytes: int | None = None) -> int:
        """KV bytes of one token over the whole model (what a P->D transfer moves)."""
        return self.kv_bytes_per_token(1, kv_dtype_bytes)

    def _attention_params(self) -> int:
        q = self.hidden_size * self.num_heads * self.head_dim
        kv = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        o = self.num_heads * self.head_dim * self.hidden_size
        return q + kv + o

    def _expert_params(self) -> int:
        return 3 * self.hidden_size * self.moe_intermediate_size

    def param_counts(self) -> dict[str, int]:
        """Parameters by how they split: tp (attention, dense MLP, vocab), ep (routed
        experts), replicated (norms, router)."""
        dense_layers = self.num_layers - self.num_moe_layers
        mlp = 3 * self.hidden_size * self.intermediate_size
        tp = self.num_layers * self._attention_params() + dense_layers * mlp
        tp += self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        ep = 0
        replicated = (2 * self.num_layers + 1) * self.hidden_size
        if self.is_moe:
            ep = self.num_moe_layers * self.num_experts * self._expert_params()
            shared = self.shared_expert_intermediate_size or (
                self.moe_intermediate_size * self.num_shared_experts
            )
            tp += self.num_moe_layers * 3 * self.hidden_size * shared
            replicated += self.num_moe_layers * self.hidden_size * self.num_experts
        return {"tp": tp, "ep": ep, "replicated": replicated}

    @property
    def num_params(self) -> int:
        return sum(self.param_counts().values())

    def weight_bytes(self, tp: int = 1, ep: int = 1) -> int:
        """Weight bytes on one rank under TP `tp` and EP `ep` (ep = 1: experts split by TP)."""
        c = self.param_counts()
        experts = c["ep"] / ep if ep > 1 else c["ep"] / max(tp, 1)
        return int((c["tp"] / max(tp, 1) + experts + c["replicated"]) * self.dtype_bytes)

    def to_json(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ModelShape:
        return cls(**{k: doc[k] for k in cls.__dataclass_fields__ if k in doc})

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any], source: str = "model config") -> ModelShape:
        """From a Hugging Face config.json dict; ConfigError names a missing/invalid field."""
        text = cfg.get("text_config")
        if isinstance(text, dict) and "num_hidden_layers" in text:
            cfg = {**cfg, **text}

        def need(*keys: str) -> int:
            for k in keys:
                v = cfg.get(k)
                if v is not None:
                    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                        raise ConfigError(
                            f"{source}: field {k!r} must be a positive integer, got {v!r}"
                        )
                    return v
            raise ConfigError(f"{source}: missing field {keys[0]!r}")

        def opt(*keys: str) -> int:
            for k in keys:
                v = cfg.get(k)
                if v is not None:
                    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                        raise ConfigError(
                            f"{source}: field {k!r} must be an integer >= 0, got {v!r}"
                        )
                    return v
            return 0

        hidden = need("hidden_size", "d_model")
        heads = need("num_attention_heads", "n_head")
        dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").removeprefix("torch.")
        if dtype not in DTYPE_BYTES:
            raise ConfigError(
                f"{source}: field 'torch_dtype' {dtype!r} is not one of {', '.join(DTYPE_BYTES)}"
            )
        experts = opt("num_experts", "num_local_experts", "n_routed_experts")
        top_k = opt("num_experts_per_tok", "moe_top_k") if experts else 0
        if experts and not 0 < top_k <= experts:
            raise ConfigError(
                f"{source}: field 'num_experts_per_tok' must be in 1..{experts}, got {top_k}"
            )
        layers = need("num_hidden_layers", "n_layer")
        dense = opt("first_k_dense_replace") if experts else 0
        window = cfg.get("sliding_window")
        if cfg.get("use_sliding_window") is False or window is None:
            window = 0
        if not isinstance(window, int) or isinstance(window, bool) or window < 0:
            raise ConfigError(
                f"{source}: field 'sliding_window' must be an integer >= 0 or null, got {window!r}"
            )
        mlp_only = cfg.get("mlp_only_layers") or []
        if experts and isinstance(mlp_only, list):
            dense += len(mlp_only)
        kwargs: dict[str, Any] = dict(
            name=str(cfg.get("_name_or_path") or cfg.get("name") or source),
            model_type=str(cfg.get("model_type", "")),
            num_layers=layers,
            hidden_size=hidden,
            num_heads=heads,
            # present and 0 is an error (need), absent means one KV head per head
            num_kv_heads=need("num_key_value_heads") if "num_key_value_heads" in cfg else heads,
            head_dim=opt("head_dim") or hidden // heads,
            intermediate_size=need("intermediate_size", "ffn_dim"),
            vocab_size=need("vocab_size"),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            num_experts=experts,
            top_k=top_k,
            moe_intermediate_size=opt("moe_intermediate_size")
            or (need("intermediate_size") if experts else 0),
            num_shared_experts=opt("n_shared_experts", "num_shared_experts"),
            shared_expert_intermediate_size=opt("shared_expert_intermediate_size"),
            num_dense_layers=min(dense, layers),
            kv_lora_rank=opt("kv_lora_rank"),
            qk_rope_head_dim=opt("qk_rope_head_dim"),
            dtype_bytes=DTYPE_BYTES[dtype],
            sliding_window=window,
        )
        try:
            return cls(**kwargs)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None

    @classmethod
    def load(cls, path: str | Path) -> ModelShape:
        """From a HF config.json file (read bounded: cluster.input_files)."""
        p = Path(path)
        doc, _ = load_json_document(p, what="model config")
        if not isinstance(doc, dict):
            raise ConfigError(f"{p}: line 1: a model config is a JSON object")
        shape = cls.from_hf_config(doc, source=str(p))
        if shape.name == str(p):
            shape = cls(**{**shape.to_json(), "name": p.stem})
        return shape
