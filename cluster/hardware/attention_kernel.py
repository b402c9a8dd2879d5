"""Which FlashAttention path vLLM runs a batch's decodes on, and the KV it reads for them.

vLLM's FLASH_ATTN backend runs every attention call of an iteration as one varlen call
(prefill chunks and decodes together, paged KV). Which kernel path the decodes take
decides how much KV they read and how fast:

- FlashAttention 2 (`vllm-flash-attn` on compute capability 8.x and 12.x: A100, A6000,
  L40, RTX 4090, RTX PRO 6000 ...), `mha_varlen_fwd` in vllm-project/flash-attention
  `csrc/flash_attn/flash_api.cpp`: a call whose longest query is one token
  (`max_seqlen_q == 1`, pure decode), with grouped-query attention and no sliding window
  (`window_size_left < 0`), is *packed*: the query heads of one KV head become rows of
  one tile (`seqlenq_ngroups_swapped`), so each KV head is read once, and only then is the
  KV split over thread blocks (`set_params_splitkv`: "Only apply split-k for decoding",
  FlashDecoding). Any other call, a batch holding one prefill chunk of more than one token
  or a model with a sliding window (Mistral-7B-v0.1, Phi-3.5/Phi-mini-MoE: every call), is
  *unpacked*: each query head is its own thread block reading its KV head, so the KV is
  read `group` = query heads per KV head times, without the split.
- FlashAttention 3 (Hopper, compute capability 9.0: H100, H200, H800, H20, GH200) packs
  grouped queries in varlen calls too (`pack_gqa`) and splits with its scheduler metadata:
  decodes read their KV once in every call.
- other GPUs: not known here (None): no unpacked reads are charged.

`decode_kv_reads(shape, tp, fa_version, mixed)` is the factor (1 or `group`) by which a
call's decodes read their KV; the pricer (cluster.hardware.pricer) holds the call to those
bytes over the GPU's memory bandwidth.
"""

from __future__ import annotations

import re

from cluster.hardware.model_shape import ModelShape

# Hopper data-centre parts serve with FlashAttention 3 in vLLM.
_FA3 = re.compile(r"\b(h100|h200|h800|h20|gh200)\b")
# Ampere, Ada and consumer/workstation Blackwell (sm120) serve with FlashAttention 2.
_FA2 = re.compile(
    r"\b(a100|a800|a40|a30|a10g?|a16|a2|a6000|a5000|a4500|a4000|rtx\s*a\d{4}|l4|l40s?|"
    r"rtx\s*(30|40|50)\d0(\s*ti)?|(30|40|50)\d0|rtx\s*pro\s*\d{4}|rtx\s*\d{4}\s*ada|"
    r"rtx3090|rtx4090|rtx5090|rtxpro6000)\b"
)


def flash_attention_version(hardware: str) -> int:
    """2 or 3: the FlashAttention version vLLM serves with on this GPU; 0 when unknown."""
    name = hardware.lower().replace("_", " ").replace("-", " ")
    if _FA3.search(name):
        return 3
    if _FA2.search(name):
        return 2
    return 0


def gqa_group(shape: ModelShape, tp: int = 1) -> int:
    """Query heads per KV head on one rank (KV heads replicated when TP exceeds them)."""
    if shape.kv_lora_rank:
        return 1  # MLA: one latent cache per token, read once by its own kernels
    t = max(tp, 1)
    q = max(shape.num_heads // t, 1)
    kv = max(shape.num_kv_heads // t, 1)
    return max(q // kv, 1)


def decodes_packed(shape: ModelShape, fa_version: int, mixed: bool) -> bool:
    """Whether a call's decodes take the packed, KV-split path (module docstring)."""
    if fa_version != 2:
        return True
    return not mixed and not shape.sliding_window


def decode_kv_reads(shape: ModelShape, tp: int, fa_version: int, mixed: bool) -> float:
    """How many times a call's decodes read their KV: 1 packed, the GQA group unpacked.

    `mixed`: the call holds a prefill chunk of more than one token (`max_seqlen_q > 1`)."""
    if decodes_packed(shape, fa_version, mixed):
        return 1.0
    return float(gqa_group(shape, tp))
