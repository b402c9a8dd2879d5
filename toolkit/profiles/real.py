"""Per-iteration times composed from real GPU profiles (paper 000 §5.1 Eq. 1-2 inputs).

Per-iteration times are composed from real operator timings (`profiles/` of the real data:
the copy bundled with pdlab, or a full copy, cluster.data), only at measured points:

    prefill = layers * (sum_i attention(t_uc_i, t_c_i) + linear(sum_i t_uc_i)) + per-iteration ops
    decode  = layers * (attention_decode(B, kv) + linear(B)) + per-iteration ops

`linear` sums every measured per-layer operator other than attention (norms, projections,
rope, MLP, activation, residual add), each once per layer as vidur's own predictor does.
Single requests take each measured attention point (t_uc = chunk, t_c = kv) with the linear
time at exactly that token count; small batches (2-8 requests) draw measured attention
points at random and keep a draw only when the summed token count is itself a measured
linear point, so nothing is interpolated. toolkit.profiles.real_report fits and scores them.

Profiles:
- "a100": vidur A100 FlashAttention of a Llama-2-70B shape at TP2 (32 query heads of 128
  per GPU) with vidur's A100 Llama-3-8B TP1 operators (also 32 query heads of 128: the same
  attention work per GPU), 32 layers, plus the embedding per iteration.
- "h100": LLMServingSim H100 Llama-3.1-70B TP4 attention and layer profiles (one model,
  one TP degree), 80 layers, plus embedding, final norm (all tokens) and lm_head (one token
  per sequence) per iteration. Its decode attention is flagged unreliable by its source.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from cluster import data
from models.work import attn_pairs

DATA_ENV = "PDLAB_DATA_DIR"
_MS = 1e-3
_NS = 1e-9


def data_dir() -> Path:
    """`$PDLAB_DATA_DIR`, else `<project root>/../shared/data`, else the copy bundled with
    pdlab (cluster.data)."""
    return data.data_dir()


@dataclass(frozen=True, slots=True, eq=False)
class OperatorTimings:
    """Measured per-layer operator times (seconds) of one GPU setup.

    prefill_attention: chunk, kv, attn_s | decode_attention: batch_size, kv, attn_s
    linear: tokens, layer_s (per layer, all non-attention ops), iter_s (once per iteration)
    seq_ops: tokens, s — per-iteration ops charged at the number of sequences (lm_head), or None
    """

    name: str
    num_layers: int
    prefill_attention: pl.DataFrame
    decode_attention: pl.DataFrame
    linear: pl.DataFrame
    seq_ops: pl.DataFrame | None
    decode_reliable: bool
    notes: tuple[str, ...]


def _read(path: Path, columns: Sequence[str], floats: Sequence[str] = ()) -> pl.DataFrame:
    if not path.is_file() and path.with_name(path.name + ".gz").is_file():
        path = path.with_name(path.name + ".gz")  # the bundled copy (polars reads gzip)
    if not path.is_file():
        raise FileNotFoundError(
            f"profile file {path} is missing; set {DATA_ENV} to a full copy of the data"
        )
    return pl.read_csv(
        path, columns=list(columns), schema_overrides=dict.fromkeys(floats, pl.Float64)
    )


def _vidur_attention(path: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    stat = {
        op: f"time_stats.{op}.mean"
        for op in ("attn_prefill", "attn_decode", "attn_input_reshape", "attn_output_reshape")
    }
    raw = _read(
        path,
        ["batch_size", "prefill_chunk_size", "kv_cache_size", "is_prefill", *stat.values()],
        list(stat.values()),
    )
    reshape = pl.col(stat["attn_input_reshape"]).fill_null(0.0) + pl.col(
        stat["attn_output_reshape"]
    ).fill_null(0.0)
    # Repeated measurements of one point are averaged.
    pre = (
        raw.filter(pl.col("is_prefill"))
        .group_by(chunk="prefill_chunk_size", kv="kv_cache_size")
        .agg(attn_s=((pl.col(stat["attn_prefill"]) + reshape) * _MS).mean())
    )
    dec = (
        raw.filter(~pl.col("is_prefill"))
        .group_by(batch_size="batch_size", kv="kv_cache_size")
        .agg(attn_s=((pl.col(stat["attn_decode"]) + reshape) * _MS).mean())
    )
    return pre.sort("chunk", "kv"), dec.sort("batch_size", "kv")


def _load_a100(root: Path) -> OperatorTimings:
    pre, dec = _vidur_attention(
        root / "profiles/vidur/a100_attention_llama2-70b-shape_tp2_commit-e2d00e9.csv"
    )
    layer_ops = (
        "input_layernorm",
        "attn_pre_proj",
        "attn_rope",
        "attn_post_proj",
        "post_attention_layernorm",
        "mlp_up_proj",
        "mlp_act",
        "mlp_down_proj",
        "add",
    )
    cols = {op: f"time_stats.{op}.mean" for op in (*layer_ops, "emb")}
    mlp = _read(
        root / "profiles/vidur/a100_Meta-Llama-3-8B_mlp.csv",
        ["num_tokens", "num_tensor_parallel_workers", *cols.values()],
    )
    linear = (
        mlp.filter(pl.col("num_tensor_parallel_workers") == 1)
        .group_by(tokens="num_tokens")
        .agg(
            layer_s=(pl.sum_horizontal([pl.col(cols[op]) for op in layer_ops]) * _MS).mean(),
            iter_s=(pl.col(cols["emb"]) * _MS).mean(),
        )
        .sort("tokens")
    )
    notes = (
        "attention: vidur A100 FlashAttention, Llama-2-70B shape at TP2 (32 q heads x 128 per GPU, "
        "4 KV heads), input/output reshapes included",
        "linear: vidur A100 Llama-3-8B TP1 (32 q heads x 128, 8 KV heads): norms, QKV, rope, "
        "O, MLP up/act/down, add; 32 layers; embedding once per iteration",
        "no lm_head / sampling / CPU overheads: not measured for this setup at batch 1-8",
    )
    return OperatorTimings("a100", 32, pre, dec, linear, None, True, notes)


def _load_h100(root: Path) -> OperatorTimings:
    prof = root / "profiles/llmservingsim_h100"
    stat = ["time_stats.attn_prefill.mean", "time_stats.attn_decode.mean"]
    raw = _read(
        prof / "h100_llama31_70b_tp4_attention.csv",
        ["batch_size", "prefill_chunk_size", "kv_cache_size", "is_prefill", *stat],
        stat,
    )
    pre = (
        raw.filter(pl.col("is_prefill"))
        .group_by(chunk="prefill_chunk_size", kv="kv_cache_size")
        .agg(attn_s=(pl.col(stat[0]) * _MS).mean())
    )
    dec = (
        raw.filter(~pl.col("is_prefill"))
        .group_by(batch_size="batch_size", kv="kv_cache_size")
        .agg(attn_s=(pl.col(stat[1]) * _MS).mean())
    )
    layers = _read(prof / "h100_llama31_70b_tp4_layers.csv", ["layer_name", "input", "latency(ns)"])
    wide = layers.pivot(
        on="layer_name", index="input", values="latency(ns)", aggregate_function="mean"
    )
    layer_ops = (
        "input_layernorm",
        "q_proj",
        "k_proj",
        "v_proj",
        "rope",
        "o_proj",
        "post_layernorm",
        "gate_proj",
        "up_proj",
        "act_fn",
        "down_proj",
    )
    linear = wide.select(
        tokens=pl.col("input"),
        layer_s=pl.sum_horizontal(layer_ops) * _NS,
        iter_s=(pl.col("embedding") + pl.col("final_layernorm")) * _NS,
    ).sort("tokens")
    seq_ops = wide.select(tokens=pl.col("input"), s=pl.col("lm_head") * _NS).sort("tokens")
    notes = (
        "attention and layers: LLMServingSim H100 Llama-3.1-70B TP4 (16 q heads x 128 per GPU); "
        "its own 'attn' layer row (no KV) is replaced by the attention profile; 80 layers",
        "embedding and final norm per iteration at all tokens; lm_head at one token per sequence",
        "prefill attention covers chunks 32-1024 with 32-2016 cached tokens (sparse: 232 points)",
        "decode attention is flagged inconsistent by its source (time falls as the batch grows "
        "at fixed KV); reported, not asserted",
    )
    return OperatorTimings(
        "h100",
        80,
        pre.sort("chunk", "kv"),
        dec.sort("batch_size", "kv"),
        linear,
        seq_ops,
        False,
        notes,
    )


PROFILES: dict[str, Callable[[Path], OperatorTimings]] = {"a100": _load_a100, "h100": _load_h100}
PROFILE_DIRS = {"a100": "profiles/vidur", "h100": "profiles/llmservingsim_h100"}  # under a root


def load_profile(name: str, root: Path | None = None) -> OperatorTimings:
    if name not in PROFILES:
        raise KeyError(f"unknown hardware profile {name!r}; profiles: {', '.join(PROFILES)}")
    return PROFILES[name](root or data.data_root(PROFILE_DIRS[name]))


def _lookup(table: pl.DataFrame, col: str, tokens: np.ndarray) -> np.ndarray:
    """Values of `col` at exactly measured token counts (KeyError-free: caller ensures)."""
    keys = table["tokens"].to_numpy()
    idx = np.searchsorted(keys, tokens)
    return table[col].to_numpy()[idx]


def compose_prefill(
    profile: OperatorTimings, num_batches: int | None = None, seed: int = 0
) -> pl.DataFrame:
    """Per-iteration prefill times: every measured single-request point and `num_batches`
    batches of 2-8 requests (default: as many as singles). Columns: kind, num_reqs, t_uc,
    t_c, attn_pairs, t_rst, duration_s."""
    att = profile.prefill_attention
    grid = profile.linear["tokens"].to_numpy()
    chunk = att["chunk"].to_numpy()
    kv = att["kv"].to_numpy()
    attn = att["attn_s"].to_numpy()
    on_grid = np.isin(chunk, grid)
    if not on_grid.all():  # not the case for the shipped profiles; refuse to interpolate
        raise ValueError(
            f"{profile.name}: attention chunk sizes {sorted(set(chunk[~on_grid]))} have no linear profile point"
        )
    pairs = attn_pairs(chunk.astype(np.float64), kv.astype(np.float64))
    seq = (
        (lambda n: _lookup(profile.seq_ops, "s", n))
        if profile.seq_ops is not None
        else (lambda n: np.zeros(len(n)))
    )
    layers = profile.num_layers
    single_t = (
        layers * (attn + _lookup(profile.linear, "layer_s", chunk))
        + _lookup(profile.linear, "iter_s", chunk)
        + seq(np.ones(len(chunk), np.int64))
    )

    rng = np.random.default_rng(seed)
    want = len(chunk) if num_batches is None else num_batches
    draws = max(20 * want, 1000)
    size = rng.integers(2, 9, draws)
    pick = rng.integers(0, len(chunk), (draws, 8))
    used = np.arange(8)[None, :] < size[:, None]
    total = np.where(used, chunk[pick], 0).sum(axis=1)
    keep = np.flatnonzero(np.isin(total, grid))[:want]
    if len(keep) < want:
        raise ValueError(
            f"{profile.name}: only {len(keep)} of {want} batches land on measured token counts"
        )
    size, pick, used, total = size[keep], pick[keep], used[keep], total[keep]
    batch_t = (
        layers
        * (np.where(used, attn[pick], 0.0).sum(axis=1) + _lookup(profile.linear, "layer_s", total))
        + _lookup(profile.linear, "iter_s", total)
        + seq(size)
    )
    return pl.DataFrame(
        {
            "kind": ["single"] * len(chunk) + ["batch"] * len(keep),
            "num_reqs": np.concatenate([np.ones(len(chunk), np.int64), size]),
            "t_uc": np.concatenate([chunk, total]),
            "t_c": np.concatenate([kv, np.where(used, kv[pick], 0).sum(axis=1)]),
            "attn_pairs": np.concatenate([pairs, np.where(used, pairs[pick], 0.0).sum(axis=1)]),
            "t_rst": np.zeros(len(chunk) + len(keep), np.int64),
            "duration_s": np.concatenate([single_t, batch_t]),
        }
    )


def compose_decode(profile: OperatorTimings) -> pl.DataFrame:
    """Per-iteration decode times at every measured (B, kv) whose B is a measured linear
    token count. Columns: batch_size, kv, t_fwd, duration_s."""
    att = profile.decode_attention.filter(
        pl.col("batch_size").is_in(profile.linear["tokens"].implode())
    )
    b = att["batch_size"].to_numpy()
    t = profile.num_layers * (
        att["attn_s"].to_numpy() + _lookup(profile.linear, "layer_s", b)
    ) + _lookup(profile.linear, "iter_s", b)
    if profile.seq_ops is not None:
        t = t + _lookup(profile.seq_ops, "s", b)
    return pl.DataFrame(
        {"batch_size": b, "kv": att["kv"].to_numpy(), "t_fwd": np.ones(len(b)), "duration_s": t}
    )
