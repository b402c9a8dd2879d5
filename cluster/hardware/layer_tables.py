"""Operator tables from LLMServingSim's `layers.csv` + `attention.csv` profile layout.

The layout of LLMServingSim's ispass26 artifact (`llm_profile/perf_models/<GPU>/<org>/
<model>/tp<N>/`), one rank of a TP group measured in eager mode:
- layers.csv (`layer_name, input, kv_cache, tp_size, latency(ns)`): every module of one
  decoder layer by `input` tokens (embedding, input_layernorm, q/k/v_proj, rope, attn,
  o_proj, post_layernorm, gate_proj, up_proj, act_fn, down_proj, final_layernorm, lm_head);
  an MoE model has `gate` (the router) and one expert's `expert.w1/w2/w3` by the tokens
  routed to that expert instead of the dense MLP;
- attention.csv: one `flash_attn_varlen_func` call per row (the FlashAttention 2 package,
  KV contiguous, not paged), `time_stats.attn_prefill.mean` (ms) of a prefill chunk of
  `prefill_chunk_size` tokens whose context is then `kv_cache_size` tokens (the chunk
  included), or `time_stats.attn_decode.mean` (ms) of `batch_size` decodes sharing
  `kv_cache_size` tokens of KV between them: the profiler
  (`llm_profile/profiler/attention/attention_profiler.py`, `_build_varlen_qkv`) gives each
  decode `kv_cache_size // batch_size` keys, so a decode row's KV axis is the batch's total
  (its 128 decodes "of 2,560 tokens" are 128 decodes of 20 tokens). The kernel is not
  vLLM's decode kernel (no paging, no KV split): the pricer uses these rows as launch costs
  and lower bounds next to the KV read at the memory bandwidth
  (cluster.hardware.attention_kernel, cluster.hardware.pricer).

They become the same `OperatorTables` as the dense.csv layout, so the pricer and the fits
(cluster.hardware.operator_profile) are shared:
- per layer: the norms, projections, rope and (dense) MLP at N tokens; `attn` is left out
  (attention.csv prices attention with its KV);
- per iteration: embedding and final_layernorm at N tokens; lm_head per sequence (vLLM
  computes logits for the last token of each sequence only);
- attention rows (prefill_chunk, kv_prefill = kv_cache_size - chunk, n_decode, kv_decode =
  the decodes' total KV; `attention_kind` "fa2-varlen"): the profile has no mixed calls,
  so the pricer adds a prefill call and a decode call (cluster.hardware.pricer);
- MoE (App. B.3): the block for T tokens touching e distinct experts is
  gate(T) + e * expert(T*k/e) + act_fn(T*k): the router on every token, e experts of
  T*k/e routed tokens each (w1 + w3 + w2, linear between measured token counts), one
  activation over the routed rows (vLLM's fused MoE runs it once per layer, not per
  expert). Expert rows are whole experts at every TP (the TP 2 bundles measure the same
  expert times as TP 1; LLMServingSim: "expert weight is not tensor parallelized"), so
  under TP t the experts' part is divided by t (vLLM shards each expert t ways); the router
  is replicated.
TP scaling of a TP 1 bundle follows operator_tables (norms and embedding replicated, the
rest divided by t, attention above its launch floor divided by t).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_tables import (
    OperatorTables,
    ProfileError,
    Table1D,
    has_file,
    open_csv,
)

NS = 1e-9
MS = 1e-3
LAYER_COLUMNS = ("layer_name", "input", "latency(ns)")
ATTENTION_COLUMNS = (
    "batch_size",
    "prefill_chunk_size",
    "kv_cache_size",
    "is_prefill",
    "time_stats.attn_prefill.mean",
    "time_stats.attn_decode.mean",
)
PER_ITERATION = ("embedding", "final_layernorm")
PER_SEQUENCE = ("lm_head",)
REPLICATED = frozenset({"input_layernorm", "post_layernorm", "final_layernorm", "embedding"})
MOE_OPS = frozenset({"gate", "expert.w1", "expert.w2", "expert.w3"})
EXPERT_OPS = ("expert.w1", "expert.w2", "expert.w3")
NOT_DENSE = frozenset({"attn", *PER_ITERATION, *PER_SEQUENCE})
# Token counts of the MoE block's grid: every count to 64, then every 16th (linear between).
_MOE_TOKENS = np.unique(np.concatenate([np.arange(1, 65), np.arange(64, 1 << 20, 16)]))


def is_layers_layout(directory: str | Path) -> bool:
    """True when the folder holds layers.csv + attention.csv (and no dense.csv)."""
    d = Path(directory)
    return has_file(d / "layers.csv") and not (d / "dense.csv").is_file()


def _read_layers(path: Path) -> dict[str, Table1D]:
    """Seconds by token count per module (repeated measurements averaged)."""
    try:
        f = open_csv(path)
    except FileNotFoundError:
        raise ProfileError(f"{path}: file is missing") from None
    sums: dict[str, dict[int, list[float]]] = {}
    with f:
        reader = csv.DictReader(f)
        got = tuple(reader.fieldnames or ())
        missing = [c for c in LAYER_COLUMNS if c not in got]
        if missing:
            raise ProfileError(
                f"{path}: line 1: missing column(s) {', '.join(missing)} (header: {', '.join(got) or 'empty'})"
            )
        for row in reader:
            line = reader.line_num
            name = (row["layer_name"] or "").strip()
            if not name:
                raise ProfileError(f"{path}: line {line}: field layer_name is empty")
            tokens = _num(path, line, "input", row["input"], integer=True)
            ns = _num(path, line, "latency(ns)", row["latency(ns)"])
            acc = sums.setdefault(name, {}).setdefault(int(tokens), [0.0, 0.0])
            acc[0] += ns * NS
            acc[1] += 1
    if not sums:
        raise ProfileError(f"{path}: line 2: no rows")
    out = {}
    for name, by in sums.items():
        xs = sorted(by)
        out[name] = Table1D(
            np.asarray(xs, dtype=np.float64), np.asarray([by[x][0] / by[x][1] for x in xs])
        )
    return out


def _num(path: Path, line: int, field: str, text: str | None, *, integer: bool = False) -> float:
    try:
        v = float(text) if text not in (None, "") else float("nan")
    except ValueError:
        v = float("nan")
    if not np.isfinite(v) or v < 0 or (integer and v != int(v)):
        kind = "an integer >= 0" if integer else "a finite number >= 0"
        raise ProfileError(f"{path}: line {line}: field {field} must be {kind}, got {text!r}")
    return v


def _read_attention(path: Path, factor: float) -> np.ndarray:
    """Rows (prefill_chunk, kv_prefill, n_decode, kv_decode, seconds), duplicates averaged;
    a decode row's kv_decode is the KV of all its decodes together (module docstring)."""
    try:
        f = open_csv(path)
    except FileNotFoundError:
        raise ProfileError(f"{path}: file is missing") from None
    acc: dict[tuple[int, int, int, int], list[float]] = {}
    with f:
        reader = csv.DictReader(f)
        got = tuple(reader.fieldnames or ())
        missing = [c for c in ATTENTION_COLUMNS if c not in got]
        if missing:
            raise ProfileError(
                f"{path}: line 1: missing column(s) {', '.join(missing)} (header: {', '.join(got) or 'empty'})"
            )
        for row in reader:
            line = reader.line_num
            flag = (row["is_prefill"] or "").strip().lower()
            if flag not in ("true", "false", "1", "0"):
                raise ProfileError(
                    f"{path}: line {line}: field is_prefill must be True or False, got {row['is_prefill']!r}"
                )
            b = int(_num(path, line, "batch_size", row["batch_size"], integer=True))
            kv = int(_num(path, line, "kv_cache_size", row["kv_cache_size"], integer=True))
            if flag in ("true", "1"):
                chunk = int(
                    _num(path, line, "prefill_chunk_size", row["prefill_chunk_size"], integer=True)
                )
                if b != 1:
                    continue  # a call over several prefills: the pricer composes those itself
                if chunk < 1 or kv < chunk:
                    raise ProfileError(
                        f"{path}: line {line}: field kv_cache_size must be >= prefill_chunk_size "
                        f">= 1, got {kv} and {chunk}"
                    )
                col = "time_stats.attn_prefill.mean"
                key = (chunk, kv - chunk, 0, 0)
            else:
                if b < 1:
                    raise ProfileError(
                        f"{path}: line {line}: field batch_size must be >= 1, got {b}"
                    )
                col = "time_stats.attn_decode.mean"
                key = (0, 0, b, kv)
            s = _num(path, line, col, row[col]) * MS
            a = acc.setdefault(key, [0.0, 0.0])
            a[0] += s
            a[1] += 1
    if not any(k[0] for k in acc) or not any(k[2] for k in acc):
        raise ProfileError(f"{path}: needs both prefill and decode rows")
    rows = np.asarray([(*k, v[0] / v[1]) for k, v in sorted(acc.items())], dtype=np.float64)
    if factor != 1.0:
        floor = float(rows[:, 4].min())
        rows[:, 4] = floor + (rows[:, 4] - floor) / factor
    return rows


def _sum_tables(tables: list[tuple[Table1D, float]]) -> Table1D:
    xs = np.unique(np.concatenate([t.x for t, _ in tables]))
    return Table1D(xs, sum((w * np.asarray(t(xs)) for t, w in tables), np.zeros_like(xs)))


def _moe_rows(ops: dict[str, Table1D], shape: ModelShape, tp: int, path: Path) -> np.ndarray:
    """Rows (tokens, activated_experts, seconds) of the MoE block on one rank (module doc)."""
    missing = [op for op in ("gate", *EXPERT_OPS) if op not in ops]
    if missing:
        raise ProfileError(
            f"{path}: {shape.name} is an MoE model but layers.csv has no {', '.join(missing)} rows"
        )
    k, n_exp = shape.top_k, shape.num_experts
    limit = float(ops["gate"].x[-1])
    tokens = _MOE_TOKENS[limit >= _MOE_TOKENS].astype(np.float64)
    act = ops.get("act_fn")
    rows = []
    for e in range(1, n_exp + 1):
        per = tokens * k / e
        expert = sum(np.asarray(ops[op](per)) for op in EXPERT_OPS)
        block = e * expert + (np.asarray(act(tokens * k)) if act is not None else 0.0)
        secs = np.asarray(ops["gate"](tokens)) + block / tp
        rows.append(np.column_stack([tokens, np.full_like(tokens, e), secs]))
    return np.vstack(rows)


def load_layer_tables(
    directory: str | Path, shape: ModelShape, *, profiled_tp: int = 1, tp: int | None = None
) -> OperatorTables:
    """OperatorTables of a layers.csv + attention.csv folder (module docstring)."""
    d = Path(directory)
    if not d.is_dir():
        raise ProfileError(f"{d}: not a profile directory")
    target = profiled_tp if tp is None else tp
    if target != profiled_tp and profiled_tp != 1:
        raise ProfileError(
            f"{d}: measured at TP {profiled_tp}; scaling is from TP 1 only (pass the tp1 "
            f"folder, or one measured at TP {target})"
        )
    factor = target / profiled_tp
    ops = _read_layers(d / "layers.csv")

    def scale(op: str) -> float:
        return 1.0 if op in REPLICATED else 1.0 / factor

    moe = shape.is_moe
    layer_ops = [
        op for op in ops if op not in NOT_DENSE and not (moe and (op in MOE_OPS or op == "act_fn"))
    ]
    if moe and any(op in ops for op in ("gate_proj", "up_proj", "down_proj")):
        raise ProfileError(f"{d}: layers.csv has a dense MLP but {shape.name} is an MoE model")
    if not moe and any(op in ops for op in EXPERT_OPS):
        raise ProfileError(
            f"{d}: layers.csv has expert rows but {shape.name} is dense: pass the MoE model's config"
        )
    if not layer_ops:
        raise ProfileError(f"{d}: layers.csv has no per-layer operators")
    missing = [op for op in (*PER_ITERATION, *PER_SEQUENCE) if op not in ops]
    if missing:
        raise ProfileError(f"{d}: layers.csv has no {', '.join(missing)} rows")
    dense_layer = _sum_tables([(ops[op], scale(op)) for op in layer_ops])
    dense_iter = _sum_tables([(ops[op], scale(op)) for op in PER_ITERATION])
    per_seq = _sum_tables([(ops[op], scale(op)) for op in PER_SEQUENCE])
    attention = _read_attention(d / "attention.csv", factor)
    moe_rows = _moe_rows(ops, shape, target, d) if moe else None
    names = tuple(sorted(ops))
    return OperatorTables(
        dense_layer, dense_iter, per_seq, attention, moe_rows, names, target, "fa2-varlen"
    )
