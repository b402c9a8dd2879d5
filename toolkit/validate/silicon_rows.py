"""Rows of AIConfigurator's `silicon_sample.csv`: real deployments with measured TTFT and TPOT.

Each row is one benchmark point: system, backend (and its version), model, precision,
aggregated (`agg`: one replica of TP x attention-DP GPUs, MoE TP x EP over the same GPUs)
or disaggregated (`disagg`: prefill and decode workers, each with its own parallelism and
count), ISL, OSL, concurrency (`silicon_concurrency=` in the source column; else the batch
size times the DP ranks, as AIConfigurator counts it) and the measured mean TTFT and TPOT
in milliseconds. `load_rows` reads and checks them; `SiliconRow.partition` is
system/backend/mode/family.

Model configs: the Hugging Face config.json of the row's model, looked up under the given
directories by the row's id (`org--name_config.json`, AIConfigurator's naming, or
`org/name.json`); `MODEL_ALIASES` maps checkpoints whose config is not shipped to one of
the same architecture (a quantized or instruct variant of the same shapes; the row's own
quantization columns say how it runs).
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.core import ConfigError

MODEL_ALIASES = {
    "meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Meta-Llama-3.1-8B",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "meta-llama/Meta-Llama-3.1-8B",
    "nvidia/Qwen3-32B-NVFP4": "Qwen/Qwen3-32B",
    "nvidia/DeepSeek-R1-NVFP4": "deepseek-ai/DeepSeek-R1",
    "zhipuai/GLM-5": "zai-org/GLM-5",
}
FAMILIES = (  # (substring of the lowercased model id, family), first match wins
    ("llama", "llama"),
    ("qwen3.5", "qwen3.5"),
    ("qwen3-235b", "qwen3-moe"),
    ("qwen3-30b", "qwen3-moe"),
    ("qwen3", "qwen3"),
    ("minimax", "minimax"),
    ("deepseek", "deepseek"),
    ("kimi", "kimi"),
    ("gpt-oss", "gpt-oss"),
    ("glm", "glm"),
)
REQUIRED = (
    "id",
    "system",
    "backend",
    "model_path",
    "mode",
    "isl",
    "osl",
    "silicon_ttft_ms",
    "silicon_tpot_ms",
)


def _int(v: str | None) -> int | None:
    if v is None or v.strip() == "":
        return None
    x = float(v)
    return None if math.isnan(x) else int(x)


@dataclass(frozen=True, slots=True)
class Parallel:
    """One worker's parallelism: attention TP x DP ranks; MoE TP x EP over the same GPUs."""

    tp: int
    dp: int
    moe_tp: int
    moe_ep: int
    pp: int = 1
    batch_size: int | None = None
    workers: int = 1

    @classmethod
    def from_columns(cls, cols: dict[str, int | None], is_moe: bool) -> Parallel:
        tp = cols.get("tp_size") or 1
        dp = cols.get("attention_dp_size") or 1
        moe_tp, moe_ep = cols.get("moe_tp_size") or 0, cols.get("moe_ep_size") or 0
        if is_moe:
            if moe_tp * moe_ep == 0:
                moe_tp, moe_ep = (tp * dp, 1) if not moe_ep else (tp * dp // moe_ep, moe_ep)
            if moe_tp * moe_ep != tp * dp and not cols.get("attention_dp_size"):
                dp = max(moe_tp * moe_ep // tp, 1)  # the DP ranks the MoE width implies
        else:
            moe_tp, moe_ep = tp * dp, 1
        return cls(tp, dp, moe_tp, moe_ep, cols.get("pp_size") or 1, cols.get("batch_size"),
                   cols.get("num_workers") or 1)  # fmt: skip

    @property
    def gpus(self) -> int:
        return self.tp * self.dp * self.pp * self.workers


@dataclass(frozen=True, slots=True)
class SiliconRow:
    row_id: str
    system: str
    backend: str
    backend_version: str
    model_path: str
    precision: str
    mode: str  # agg | disagg
    isl: int
    osl: int
    gemm_quant: str | None
    moe_quant: str | None
    concurrency: int
    agg: dict[str, int | None]
    prefill: dict[str, int | None]
    decode: dict[str, int | None]
    ttft_ms: float
    tpot_ms: float

    @property
    def model_id(self) -> str:
        return MODEL_ALIASES.get(self.model_path, self.model_path)

    @property
    def family(self) -> str:
        low = self.model_path.lower()
        return next((f for key, f in FAMILIES if key in low), low.split("/")[-1])

    @property
    def partition(self) -> str:
        return f"{self.system}/{self.backend}/{self.mode}/{self.family}"

    def parallel(self, stage: str, is_moe: bool) -> Parallel:
        """`agg`, `prefill` or `decode` parallelism."""
        cols = {"agg": self.agg, "prefill": self.prefill, "decode": self.decode}[stage]
        return Parallel.from_columns(cols, is_moe)


def _stage(row: dict[str, str], prefix: str) -> dict[str, int | None]:
    keys = (
        "batch_size",
        "num_workers",
        "tp_size",
        "pp_size",
        "attention_dp_size",
        "moe_tp_size",
        "moe_ep_size",
    )
    return {k: _int(row.get(prefix + k)) for k in keys}


def parse_row(row: dict[str, str], line: int, source: str = "silicon CSV") -> SiliconRow:
    missing = [c for c in REQUIRED if not (row.get(c) or "").strip()]
    if missing:
        raise ConfigError(f"{source}: line {line}: missing {', '.join(missing)}")
    agg, pre, dec = _stage(row, ""), _stage(row, "prefill_"), _stage(row, "decode_")
    m = re.search(r"silicon_concurrency=(\d+)", row.get("silicon_data_source") or "")
    if m:
        conc = int(m.group(1))
    elif row["mode"] == "agg":
        conc = (agg["batch_size"] or 1) * (agg["attention_dp_size"] or 1)
    else:
        conc = (
            (dec["batch_size"] or 1) * (dec["num_workers"] or 1) * (dec["attention_dp_size"] or 1)
        )
    try:
        isl, osl = int(float(row["isl"])), int(float(row["osl"]))
        ttft, tpot = float(row["silicon_ttft_ms"]), float(row["silicon_tpot_ms"])
    except ValueError as exc:
        raise ConfigError(f"{source}: line {line}: {exc}") from None
    if row["mode"] not in ("agg", "disagg"):
        raise ConfigError(f"{source}: line {line}: mode {row['mode']!r} is not agg or disagg")
    return SiliconRow(
        row["id"], row["system"], row["backend"], (row.get("backend_version") or "").strip(),
        row["model_path"], (row.get("precision") or "").strip(), row["mode"], isl, osl,
        (row.get("gemm_quant_mode") or "").strip() or None,
        (row.get("moe_quant_mode") or "").strip() or None, conc, agg, pre, dec, ttft, tpot,
    )  # fmt: skip


def load_rows(path: str | Path) -> list[SiliconRow]:
    """Every row of a silicon CSV (ConfigError names the file, line and field)."""
    p = Path(path)
    try:
        f = p.open(newline="")
    except FileNotFoundError:
        raise ConfigError(f"silicon CSV {str(p)!r} does not exist") from None
    with f:
        reader = csv.DictReader(f)
        cols = set(reader.fieldnames or ())
        missing = [c for c in REQUIRED if c not in cols]
        if missing:
            raise ConfigError(f"{p}: line 1: missing column(s) {', '.join(missing)}")
        return [parse_row(r, reader.line_num, str(p)) for r in reader]


def find_model_config(model_id: str, dirs: Iterable[Path]) -> Path | None:
    """The config.json of `model_id` under `dirs` (module docstring), or None."""
    names = (
        f"{model_id.replace('/', '--')}_config.json",
        f"{model_id}.json",
        f"{model_id}/config.json",
    )
    for d in dirs:
        for n in names:
            if (d / n).is_file():
                return d / n
    return None


def read_config(path: Path) -> dict[str, Any]:
    doc = json.loads(path.read_text())
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: a model config is a JSON object")
    return doc
