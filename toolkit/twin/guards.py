"""Whether a profile describes the run it is asked to replay (`pdlab twin` guards, SPEC §9).

A twin priced by another model's or another GPU's profile prints a normal-looking table
that means nothing. `check_profile` compares:
- the model: with the dimensions the run recorded (`config.model_shape`, from the HF config
  given at import) the layers, attention heads, KV heads, hidden size, routed experts and
  experts per token must all agree; with only the run's model name (`config.model`, the
  engine's served model) the names must agree (organisation and case ignored); with
  neither, the model is "unchecked";
- the GPU: the run's (vLLM's device name, or the cluster description's) against the one
  the profile declares (`pdlab profile import --hardware`); names agree when one holds the
  other once vendor words and punctuation are dropped ("NVIDIA GeForce RTX 4090" holds
  "RTX4090"); when either side records none, the GPU is "unchecked".
A mismatch is a `ProfileMismatch` (a ConfigError naming both sides) unless `force`: then
each check says "FORCED" and the twin run stores it (`config.forced`).

`extrapolation` lists where the run's settings leave what the profile measured: a TP degree
scaled from another one's measurement, DP/EP collectives (no profile measures them),
batches larger than the measured decode batches or sequences, more tokens per iteration
than the dense grid, contexts longer than the attention grid's.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import numpy as np

from cluster.core import ConfigError
from cluster.hardware.engine_settings import EngineSettings
from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_profile import OperatorProfile

# Dimensions that must agree, as (ModelShape field, what the message calls it).
DIMENSIONS = (
    ("num_layers", "layers"),
    ("num_heads", "heads"),
    ("num_kv_heads", "KV heads"),
    ("hidden_size", "hidden size"),
    ("num_experts", "experts"),
    ("top_k", "top-k"),
)
_VENDOR = re.compile(r"nvidia|geforce|amd|radeon|instinct|tesla|[^a-z0-9]")
UNKNOWN_GPU = ("", "unknown", "test", "none")


class ProfileMismatch(ConfigError):
    """The profile is for another model or GPU than the run (the message names both)."""


class GuardReport(NamedTuple):
    model: str  # "checked (dimensions)", "checked (name)", "unchecked: ...", "FORCED: ..."
    gpu: str
    forced: bool
    extrapolating: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "gpu": self.gpu,
            "forced": self.forced,
            "extrapolating": self.extrapolating,
        }


def _model_name(text: str) -> str:
    return text.rstrip("/").split("/")[-1].strip().lower()


def gpu_key(text: str) -> str:
    return _VENDOR.sub("", text.lower())


def model_check(shape: ModelShape, config: dict[str, Any]) -> tuple[str, str | None]:
    """(what was checked, the mismatch or None)."""
    rec = config.get("model_shape")
    if isinstance(rec, dict):
        diffs = [
            f"{label} {rec.get(field)} vs {getattr(shape, field)}"
            for field, label in DIMENSIONS
            if rec.get(field) is not None and int(rec[field]) != int(getattr(shape, field))
        ]
        name = rec.get("name") or config.get("model") or "its model"
        if diffs:
            return "dimensions", f"run served {name}, profile is for {shape.name}: " + (
                ", ".join(diffs)
            )
        return "checked (dimensions)", None
    engine = config.get("engine") if isinstance(config.get("engine"), dict) else {}
    served = config.get("model") or (engine or {}).get("model")
    if not isinstance(served, str) or not served:
        return "unchecked: the run records no model (import it with --model-config)", None
    if _model_name(served) != _model_name(shape.name):
        return "name", (
            f"run served {served}, profile is for {shape.name} (only names recorded: import "
            "the run with --model-config to compare dimensions)"
        )
    return "checked (name)", None


def run_gpu(config: dict[str, Any], node_hardware: list[str]) -> str | None:
    engine = config.get("engine") if isinstance(config.get("engine"), dict) else {}
    for name in [(engine or {}).get("hardware"), *node_hardware]:
        if isinstance(name, str) and name.strip().lower() not in UNKNOWN_GPU:
            return name
    return None


def gpu_check(run: str | None, profile: str | None) -> tuple[str, str | None]:
    if not run or not profile:
        missing = "the run" if not run else "the profile (pdlab profile import --hardware)"
        return f"unchecked: {missing} records no GPU", None
    a, b = gpu_key(run), gpu_key(profile)
    if a and b and (a in b or b in a):
        return f"checked ({run} / {profile})", None
    return "gpu", f"run used {run}, profile was measured on {profile}"


def check_profile(
    op: OperatorProfile,
    config: dict[str, Any],
    node_hardware: list[str],
    *,
    force: bool = False,
    profile: str = "profile",
) -> GuardReport:
    """Model and GPU checks (module docstring); ProfileMismatch unless `force`."""
    model, model_bad = model_check(op.shape, config)
    gpu, gpu_bad = gpu_check(run_gpu(config, node_hardware), op.hardware or _engine_gpu(op))
    bad = [b for b in (model_bad, gpu_bad) if b]
    if bad and not force:
        raise ProfileMismatch(
            f"profile {profile} does not describe this run: {'; '.join(bad)} (--force replays "
            "anyway and marks the twin FORCED)"
        )
    if model_bad:
        model = f"FORCED: {model_bad}"
    if gpu_bad:
        gpu = f"FORCED: {gpu_bad}"
    return GuardReport(model, gpu, bool(bad), [])


def _engine_gpu(op: OperatorProfile) -> str | None:
    return op.engine.hardware if op.engine is not None else None


def profiled_tp(op: OperatorProfile) -> int | None:
    """The TP degree the bundle was measured at (from the profile's notes)."""
    for note in op.notes:
        m = re.match(r"measured at TP (\d+)", note)
        if m:
            return int(m.group(1))
    return None


def extrapolation(
    op: OperatorProfile, engine: EngineSettings, max_context_tokens: int
) -> list[str]:
    """Where the run's settings leave what the profile measured (module docstring)."""
    out = []
    t = op.tables
    measured_tp = profiled_tp(op)
    if measured_tp is not None and measured_tp != engine.tensor_parallel_size:
        out.append(f"TP {engine.tensor_parallel_size} scaled from a TP {measured_tp} measurement")
    if engine.expert_parallel_size > 1 and op.shape.is_moe:
        out.append(f"EP {engine.expert_parallel_size}: dispatch/combine modelled, not measured")
    if engine.data_parallel_size > 1 and engine.expert_parallel_size > 1 and op.shape.is_moe:
        out.append(f"DP {engine.data_parallel_size} ranks in step: not measured")
    att = t.attention
    max_batch = int(max(att[:, 2].max(), t.per_seq.x[-1]))
    if engine.max_num_seqs and engine.max_num_seqs > max_batch:
        out.append(f"batch {engine.max_num_seqs} > {max_batch} measured")
    tokens = int(min(t.max_tokens, max(att[:, 0].max(), att[:, 2].max())))
    if engine.max_num_batched_tokens and engine.max_num_batched_tokens > tokens:
        out.append(f"chunk {engine.max_num_batched_tokens} tokens > {tokens} measured")
    ctx = int(np.max(att[:, [1, 3]]))
    if max_context_tokens > ctx:
        out.append(f"context {max_context_tokens} tokens > {ctx} measured")
    return out
