"""Measured operator timings of one GPU setup, per rank (LLMServingSim's profile bundle).

An LLMServingSim profile directory (`profiler/perf/<hw>/<model>/<variant>/tp<N>/`) holds,
in microseconds, one decoder layer's operators measured on one rank:
- dense.csv (layer, tokens, time_us): norms, projections, rope, MLP... by tokens in the batch;
- per_sequence.csv (layer, sequences, time_us): lm_head and sampler by sequences;
- attention.csv (prefill_chunk, kv_prefill, n_decode, kv_decode, time_us): one attention
  call for a prefill chunk over kv_prefill cached tokens plus n_decode decodes with
  kv_decode cached tokens each (0 = none);
- moe.csv (tokens, activated_experts, time_us), MoE models: the whole MoE block on one GPU
  holding every expert, by tokens, each routed to top-k of the distinct experts touched
  (tokens x top-k expert-token pairs; a fractional count when an EP rank's tokens received
  after dispatch are re-keyed to that, cluster.engines.torch.op_profile) (`moe_kind`
  "one-gpu"; the pricer derives an EP rank's share). A table already timed on one EP rank
  at the deployment's MoE TP/EP, by the EP group's tokens with its dispatch and combine
  included (AIConfigurator's MoE table: cluster.hardware.aiconfigurator_profile), is
  `moe_kind` "per-ep-rank" and is priced as it stands.

`OperatorTables` sums the operators into what an iteration charges (seconds): per layer
(every dense op once, `layernorm` twice: input and post-attention norm), per iteration
(`embedding`, `final_layernorm` at all tokens; `lm_head`, `sampler` per sequence), attention
per layer, MoE per layer.

TP (`load(..., profiled_tp=1, tp=N)`): a bundle measured at TP 1 is scaled to N ranks per
operator, as the measured RTX PRO 6000 Qwen3-32B TP 1 and TP 2 bundles behave: projections,
MLP, rope, activation and lm_head divide by N (weights and FLOPs split; measured TP2/TP1
0.49-0.55 at every size); norms, embedding and the sampler stay (replicated; measured
0.95-1.19); attention keeps its launch floor (the table's smallest time) and divides the rest
(measured 0.51-0.58 large, 0.98 at one decode). A bundle measured at the serving TP is used
as is. Communication (all-reduces) is in no bundle; the pricer adds it.

Malformed files raise ProfileError naming the file, line and field.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from cluster import size_limits as limits
from cluster.core import ConfigError
from cluster.input_files import InputFileError, iter_lines

FloatArray = npt.NDArray[np.float64]
US = 1e-6
PER_ITERATION = frozenset({"embedding", "final_layernorm"})
REPLICATED = frozenset({"layernorm", "final_layernorm", "qk_norm", "embedding", "sampler"})
PER_LAYER_COUNT = {"layernorm": 2}  # input_layernorm and post_attention_layernorm
ATTENTION_COLUMNS = ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode")
MOE_KINDS = ("one-gpu", "per-ep-rank")
MAX_KEY = int(limits.MODEL_LEN.hi)  # tokens, sequences or experts of one measured point
MAX_TIME_US = 3.6e9  # an hour per operator call: anything longer is a broken measurement


class ProfileError(ConfigError):
    """A profile file is missing or malformed (the message names file, line and field)."""


def _rows(path: Path, header: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    """The CSV's rows with their line numbers, read bounded (cluster.input_files)."""
    try:
        reader = csv.DictReader(iter_lines(path, what="profile CSV"))
        got = tuple(reader.fieldnames or ())
        missing = [c for c in header if c not in got]
        if missing:
            raise ProfileError(
                f"{path}: line 1: missing column(s) {', '.join(missing)} (header: {', '.join(got) or 'empty'})"
            )
        for row in reader:
            yield reader.line_num, row
    except InputFileError as exc:
        raise ProfileError(f"{path}: file is missing" if exc.missing else str(exc)) from None
    except csv.Error as exc:
        raise ProfileError(f"{path}: line {reader.line_num}: not valid CSV ({exc})") from None


def _number(path: Path, line: int, field: str, text: str | None, *, integer: bool = False) -> float:
    try:
        value = float(text) if text is not None else float("nan")
    except ValueError:
        value = float("nan")
    top = MAX_KEY if integer else MAX_TIME_US
    if not np.isfinite(value) or value < 0 or (integer and value != int(value)):
        kind = "an integer >= 0" if integer else "a finite number >= 0"
        raise ProfileError(f"{path}: line {line}: field {field} must be {kind}, got {text!r}")
    if value > top:
        raise ProfileError(
            f"{path}: line {line}: field {field} must be at most {top:g}, got {text!r}"
        )
    return value


def _int_or_float(x: float) -> int | float:
    return int(x) if x == int(x) else float(x)


@dataclass(frozen=True, slots=True)
class Table1D:
    """y(x) at measured x: linear between them, the first value below, and above them the
    secant over the upper half of the range (a kernel's time keeps growing past the measured
    sizes; the secant of the last two points of a fine grid is mostly noise)."""

    x: FloatArray
    y: FloatArray

    @property
    def slope_above(self) -> float:
        x, y = self.x, self.y
        if len(x) < 2:
            return 0.0
        mid = float(np.interp(x[-1] / 2, x, y)) if x[-1] / 2 >= x[0] else y[0]
        lo = max(x[-1] / 2, x[0])
        return max((y[-1] - mid) / (x[-1] - lo), 0.0) if x[-1] > lo else 0.0

    def __call__(self, q: float | FloatArray) -> Any:
        x, y = self.x, self.y
        out = np.interp(q, x, y)
        qa = np.asarray(q, dtype=np.float64)
        out = np.where(qa > x[-1], y[-1] + self.slope_above * (qa - x[-1]), out)
        return float(out) if np.ndim(out) == 0 else out

    def to_json(self) -> dict[str, list[float]]:
        return {"x": self.x.tolist(), "y": self.y.tolist()}

    @classmethod
    def from_json(cls, doc: dict[str, list[float]]) -> Table1D:
        return cls(np.asarray(doc["x"], dtype=np.float64), np.asarray(doc["y"], dtype=np.float64))


def _per_key(
    path: Path, key: str, scale: dict[str, float], weight: dict[str, float]
) -> dict[int, float]:
    """sum over ops of weight[op] * scale[op] * time (s) per key value, from one CSV."""
    per_op: dict[str, dict[int, float]] = {}
    for line, row in _rows(path, ("layer", key, "time_us")):
        op = (row["layer"] or "").strip()
        if not op:
            raise ProfileError(f"{path}: line {line}: field layer is empty")
        k = int(_number(path, line, key, row[key], integer=True))
        per_op.setdefault(op, {})[k] = _number(path, line, "time_us", row["time_us"]) * US
    out: dict[int, float] = {}
    keys = sorted({k for v in per_op.values() for k in v})
    for op, table in per_op.items():
        w = weight.get(op, 0.0)
        if w == 0.0:
            continue
        xs = np.array(sorted(table), dtype=np.float64)
        f = Table1D(xs, np.array([table[int(k)] for k in xs]))
        for k in keys:
            out[k] = out.get(k, 0.0) + w * scale.get(op, 1.0) * float(f(k))
    return out


@dataclass(frozen=True, slots=True)
class OperatorTables:
    """Per-rank seconds an iteration charges, by operator group (module docstring)."""

    dense_layer: Table1D  # per layer, by tokens in the iteration
    dense_iter: Table1D  # once per iteration, by tokens
    per_seq: Table1D  # once per iteration, by sequences
    attention: FloatArray  # rows (prefill_chunk, kv_prefill, n_decode, kv_decode, seconds)
    moe: FloatArray | None  # rows (tokens, activated_experts, seconds) or None
    ops: tuple[str, ...]  # operator names found
    tp: int = 1
    # How attention.csv was measured: "engine" (inside the serving engine, every call shape
    # on the engine's own kernels; kv_decode per decode) or "fa2-varlen" (LLMServingSim's
    # ISPASS'26 profiler: flash_attn_varlen_func alone, no paging, no mixed calls, a decode
    # row's KV is the batch's total, split evenly: cluster.hardware.layer_tables).
    attention_kind: str = "engine"
    # FlashAttention version vLLM serves with on the profiled GPU (2, 3; 0 unknown):
    # cluster.hardware.attention_kernel
    fa_version: int = 0
    # What the MoE rows time (MOE_KINDS): "one-gpu" (LLMServingSim's moe.csv: one GPU
    # holding every expert, by tokens and activated experts) or "per-ep-rank" (one rank of
    # the deployment's MoE TP/EP by the EP group's tokens, dispatch and combine included).
    moe_kind: str = "one-gpu"

    def __post_init__(self) -> None:
        if self.moe_kind not in MOE_KINDS:
            raise ConfigError(f"moe_kind {self.moe_kind!r} is not one of {', '.join(MOE_KINDS)}")

    @classmethod
    def load(
        cls, directory: str | Path, *, profiled_tp: int = 1, tp: int | None = None
    ) -> OperatorTables:
        d = Path(directory)
        if not d.is_dir():
            raise ProfileError(f"{d}: not a profile directory")
        target = profiled_tp if tp is None else tp
        if target != profiled_tp and profiled_tp != 1:
            raise ProfileError(
                f"{d}: measured at TP {profiled_tp}; scaling is from TP 1 only (pass the tp1 bundle, "
                f"or a bundle measured at TP {target})"
            )
        factor = target / profiled_tp
        dense_ops = sorted(
            {
                (r["layer"] or "").strip()
                for _, r in _rows(d / "dense.csv", ("layer", "tokens", "time_us"))
            }
        )
        seq_ops = sorted(
            {
                (r["layer"] or "").strip()
                for _, r in _rows(d / "per_sequence.csv", ("layer", "sequences", "time_us"))
            }
        )
        scale = {op: 1.0 if op in REPLICATED else 1.0 / factor for op in (*dense_ops, *seq_ops)}
        layer_w = {
            op: float(PER_LAYER_COUNT.get(op, 1)) for op in dense_ops if op not in PER_ITERATION
        }
        iter_w = {op: 1.0 for op in dense_ops if op in PER_ITERATION}
        layer = _per_key(d / "dense.csv", "tokens", scale, layer_w)
        it = (
            _per_key(d / "dense.csv", "tokens", scale, iter_w)
            if iter_w
            else dict.fromkeys(layer, 0.0)
        )
        seq = _per_key(d / "per_sequence.csv", "sequences", scale, dict.fromkeys(seq_ops, 1.0))
        att = cls._attention(d / "attention.csv", factor)
        moe = cls._moe(d / "moe.csv", factor) if (d / "moe.csv").exists() else None

        def table(m: dict[int, float]) -> Table1D:
            k = sorted(m)
            return Table1D(np.asarray(k, dtype=np.float64), np.asarray([m[i] for i in k]))

        return cls(table(layer), table(it), table(seq), att, moe, (*dense_ops, *seq_ops), target)

    @staticmethod
    def _attention(path: Path, factor: float) -> FloatArray:
        rows = []
        for line, row in _rows(path, (*ATTENTION_COLUMNS, "time_us")):
            key = [_number(path, line, c, row[c], integer=True) for c in ATTENTION_COLUMNS]
            if key[0] == 0 and key[2] == 0:
                raise ProfileError(
                    f"{path}: line {line}: field prefill_chunk and n_decode are both 0"
                )
            rows.append((*key, _number(path, line, "time_us", row["time_us"]) * US))
        if not rows:
            raise ProfileError(f"{path}: line 2: no rows")
        a = np.asarray(rows, dtype=np.float64)
        if factor != 1.0:
            floor = float(a[:, 4].min())
            a[:, 4] = floor + (a[:, 4] - floor) / factor
        return a

    @staticmethod
    def _moe(path: Path, factor: float) -> FloatArray:
        rows = []
        for line, row in _rows(path, ("tokens", "activated_experts", "time_us")):
            t = _number(path, line, "tokens", row["tokens"])
            e = _number(path, line, "activated_experts", row["activated_experts"], integer=True)
            rows.append((t, e, _number(path, line, "time_us", row["time_us"]) * US / factor))
        if not rows:
            raise ProfileError(f"{path}: line 2: no rows")
        return np.asarray(rows, dtype=np.float64)

    @property
    def max_tokens(self) -> float:
        return float(self.dense_layer.x[-1])

    def to_json(self) -> dict[str, Any]:
        return {
            "dense_layer_s": self.dense_layer.to_json(),
            "dense_iteration_s": self.dense_iter.to_json(),
            "per_sequence_s": self.per_seq.to_json(),
            "attention_s": {
                "columns": [*ATTENTION_COLUMNS, "seconds"],
                "rows": [
                    [int(r[0]), int(r[1]), int(r[2]), int(r[3]), float(r[4])]
                    for r in self.attention
                ],
            },
            "moe_s": None
            if self.moe is None
            else {
                "columns": ["tokens", "activated_experts", "seconds"],
                "rows": [[_int_or_float(r[0]), int(r[1]), float(r[2])] for r in self.moe],
            },
            "ops": list(self.ops),
            "tp": self.tp,
            "attention_kind": self.attention_kind,
            "fa_version": self.fa_version,
            "moe_kind": self.moe_kind,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> OperatorTables:
        moe = doc.get("moe_s")
        ops = tuple(doc.get("ops", ()))
        # documents written before the field: the layers layout names q_proj, the dense one
        # qkv_proj (its stored rows are the same numbers either way)
        kind = doc.get("attention_kind") or (
            "fa2-varlen" if "q_proj" in ops and "qkv_proj" not in ops else "engine"
        )
        return cls(
            Table1D.from_json(doc["dense_layer_s"]),
            Table1D.from_json(doc["dense_iteration_s"]),
            Table1D.from_json(doc["per_sequence_s"]),
            np.asarray(doc["attention_s"]["rows"], dtype=np.float64),
            None if moe is None else np.asarray(moe["rows"], dtype=np.float64),
            ops,
            int(doc.get("tp", 1)),
            str(kind),
            int(doc.get("fa_version", 0)),
            # documents before the field: AIConfigurator's tables were per EP rank
            str(doc.get("moe_kind") or ("per-ep-rank" if "aiconfigurator" in ops else "one-gpu")),
        )
