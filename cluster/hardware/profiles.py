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
A JSON file from `pdlab fit --json` is accepted as a profile: its fitted coefficients become
the ground truth, with the base preset's other fields. Each phase is combined separately, as
the mean of the nodes' coefficients weighted by their training samples: a PD-split cluster's
prefill nodes give the prefill model and its decode nodes the decode model (a node fitted in
both phases contributes to both). A decode "ctx" form's d3 becomes the context term, a prefill
floor's knee the prefill floor (the median over the prefill nodes).
A `pdlab profile import` document (cluster.hardware.operator_profile) is accepted too: its
chosen forms' coefficients, the model's MoE shape and KV capacity when known, and `pricer`,
the measured-grid iteration pricer an engine model prices mixed batches with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from cluster.core import ConfigError
from cluster.hardware.engine import EngineSettings
from cluster.hardware.model_shape import ModelShape
from cluster.hardware.operator_profile import FORMAT as OPERATOR_FORMAT
from cluster.hardware.operator_profile import OperatorProfile
from cluster.hardware.pricer import IterationPricer
from cluster.input_files import load_json_document
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
    # Evidence-chosen forms (models.forms), all off for the presets: the prefill floor and
    # roofline terms (KV read per cached token, seconds at phi(sum t_uc) = 1), and which
    # forms the control plane's models take (node_model).
    prefill_knee_tokens: float = 0.0
    prefill_kv_read_s_per_token: float = 0.0
    prefill_expert_s: float = 0.0
    prefill_form: str = "paper"
    decode_form: str = "paper"
    # From `pdlab profile import`: the measured-grid pricer (cluster.hardware.pricer), the
    # model's shape and the engine settings the profile was imported with (None otherwise).
    pricer: IterationPricer | None = None
    model_shape: ModelShape | None = None
    engine: EngineSettings | None = None
    link_source: str = ""  # where the pricer's link came from ("": assumed)
    # an in-situ calibration record (not part of equality or hashing)
    calibration: dict[str, Any] | None = field(default=None, compare=False)

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
        """The profile's coefficients as a model (what a perfect fit of its forms would give:
        Eq. 2 omits the context term unless the profile's decode form is "ctx")."""
        prefill = PrefillModel.from_coef(self.prefill)
        if self.prefill_form != "paper":
            prefill = PrefillModel(
                *self.prefill,
                knee_tokens=self.prefill_knee_tokens,
                c4=self.prefill_kv_read_s_per_token,
                c5=self.prefill_expert_s,
                top_k=self.top_k,
                num_experts=self.num_experts,
            )
        decode = DecodeModel.from_coef(self.decode, self.top_k, self.num_experts, self.t_fwd)
        if self.decode_form == "ctx":
            decode = replace(decode, d3=self.decode_ctx_s_per_token)
        return NodeModel(
            prefill, decode, mean_new_tokens=float(self.chunk_tokens), restore_fraction=0.0
        )

    def prefill_time(
        self, sum_t_uc: float, sum_attn_pairs: float, sum_t_rst: float, sum_t_c: float = 0.0
    ) -> float:
        c0, c1, c2, c3 = self.prefill
        if not (
            self.prefill_knee_tokens or self.prefill_kv_read_s_per_token or self.prefill_expert_s
        ):
            return c0 + c1 * sum_t_uc + c2 * sum_attn_pairs + c3 * sum_t_rst
        tokens = max(sum_t_uc, self.prefill_knee_tokens) if sum_t_uc > 0 else 0.0
        experts = float(phi(sum_t_uc, self.top_k, self.num_experts))
        return (
            c0
            + c1 * tokens
            + c2 * sum_attn_pairs
            + c3 * sum_t_rst
            + self.prefill_kv_read_s_per_token * sum_t_c
            + self.prefill_expert_s * experts
        )

    def decode_times(self, batch_size: int, ctx_tokens: np.ndarray) -> np.ndarray:
        """Ground-truth decode iteration times for a batch at each iteration's total context."""
        return self.decode_base_s(batch_size) + self.decode_ctx_s_per_token * ctx_tokens

    def decode_base_s(self, batch_size: int) -> float:
        """The part of a decode iteration's ground-truth time that does not depend on the
        context: `decode_times` is this plus `decode_ctx_s_per_token` per context token."""
        d0, d1, d2 = self.decode
        return (
            d0
            + d1 * float(phi(batch_size, self.top_k, self.num_experts, self.t_fwd))
            + d2 * batch_size
        )

    def mixed_time(
        self,
        sum_t_uc: float,
        sum_attn_pairs: float,
        sum_t_rst: float,
        sum_t_c: float,
        batch_size: int,
        ctx_tokens: float,
    ) -> float:
        """Ground truth of one iteration running prefill chunks and a decode batch together
        (models.forms' mixed "paper" form: Eq. 1 + Eq. 2 sharing one constant, the larger
        of c0 and d0), for profiles without a measured-grid `pricer`."""
        t = self.prefill_time(sum_t_uc, sum_attn_pairs, sum_t_rst, sum_t_c)
        if batch_size <= 0:
            return t
        decode = float(self.decode_times(batch_size, np.array([ctx_tokens]))[0])
        return t + decode - min(self.prefill[0], self.decode[0])


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
    """A preset name, or a path to a `pdlab fit --json` file (coefficients on `base`) or to
    a `pdlab profile import` document."""
    if spec in PRESETS:
        return PRESETS[spec]
    path = Path(spec)
    if not path.is_file():
        raise ConfigError(
            f"unknown profile {spec!r}: use one of {', '.join(PRESETS)} or a path to a fit JSON"
        )
    doc, _ = load_json_document(path, what="profile")  # bounded: cluster.input_files
    if isinstance(doc, dict) and doc.get("format") == OPERATOR_FORMAT:
        return from_operator_profile(OperatorProfile.from_json(doc, str(path)), base=base)
    return from_fit_doc(doc, str(path), PRESETS[base])


def from_fit_doc(doc: object, source: str, base: HardwareProfile) -> HardwareProfile:
    """A profile with the coefficients of a `pdlab fit --json` object `doc` (each phase
    combined over the nodes, see the module docstring) and `base`'s other fields; `source`
    names the document in errors and in the profile's name."""
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    if not isinstance(nodes, list):
        raise ConfigError(f"{source}: not a `pdlab fit --json` document (no 'nodes' list)")
    # Forms with extra terms (models.forms) pad the paper coefficients: prefill c4, c5 and
    # decode d3 (0 for nodes on the paper form).
    pre = _combine(source, nodes, "prefill", 4, 6)
    dec = _combine(source, nodes, "decode", 3, 4)
    knees = sorted(
        _knee(n["prefill"].get("form", "paper"))
        for n in nodes
        if isinstance(n, dict) and isinstance(n.get("prefill"), dict) and n["prefill"].get("coef")
    ) or [0.0]
    b = base
    first = nodes[0] if nodes and isinstance(nodes[0], dict) else {}
    top_k, experts = first.get("moe_top_k", b.top_k), first.get("moe_experts", b.num_experts)
    if not (
        isinstance(top_k, int)
        and isinstance(experts, int)
        and (experts == 0 or 0 < top_k <= experts)
    ):
        raise ConfigError(
            f"{source}: nodes[0] has moe_top_k={top_k!r}, moe_experts={experts!r} (allowed: "
            "integers with 1 <= moe_top_k <= moe_experts, or moe_experts = 0 for a dense model)"
        )
    return replace(
        b,
        name=f"fit:{Path(source).name}",
        prefill=pre[:4],  # type: ignore[arg-type]
        decode=dec[:3],  # type: ignore[arg-type]
        top_k=top_k,
        num_experts=experts,
        decode_ctx_s_per_token=float(dec[3]) if dec[3] else b.decode_ctx_s_per_token,
        decode_form="ctx" if dec[3] else "paper",
        prefill_knee_tokens=knees[len(knees) // 2],
        prefill_kv_read_s_per_token=float(pre[4]),
        prefill_expert_s=float(pre[5]),
        prefill_form="paper" if not (knees[-1] or pre[4] or pre[5]) else "fit",
    )


def _knee(label: str) -> float:
    _, _, knee = str(label).partition("@")
    return float(knee) if knee else 0.0


def from_operator_profile(op: OperatorProfile, *, base: str = "gb300") -> HardwareProfile:
    """A simulator profile from an imported operator profile: the chosen forms'
    coefficients, the model's MoE shape, its engine settings and pricer."""
    b = PRESETS[base]
    pre = op.fits["prefill"].best
    dec = op.fits["decode"].best
    pc = (*pre.coef, 0.0, 0.0)
    dc = (*dec.coef, 0.0)
    engine = op.engine
    kv = op.kv_tokens or b.l1_tokens
    return replace(
        b,
        name=op.name,
        prefill=tuple(pc[:4]),  # type: ignore[arg-type]
        decode=tuple(dc[:3]),  # type: ignore[arg-type]
        top_k=op.shape.top_k if op.shape.is_moe else b.top_k,
        num_experts=op.shape.num_experts,
        t_fwd=1.0,
        t_acc=1.0,
        decode_ctx_s_per_token=dc[3],
        noise=0.0,
        l1_tokens=kv,
        l2_tokens=4 * kv,
        chunk_tokens=(engine.max_num_batched_tokens if engine else None)
        or int(op.tables.max_tokens),
        max_decode_batch=(engine.max_num_seqs if engine else None) or b.max_decode_batch,
        hardware=op.hardware or b.hardware,
        prefill_knee_tokens=_knee(pre.form),
        prefill_kv_read_s_per_token=pc[4],
        prefill_expert_s=pc[5],
        prefill_form=pre.form,
        decode_form=dec.form.partition("@")[0],
        pricer=op.pricer,
        model_shape=op.shape,
        engine=engine,
        link_source=op.link_source,
        calibration=op.calibration,
    )


def _combine(source: str, nodes: list[object], phase: str, n: int, n_max: int) -> tuple[float, ...]:
    """Sample-weighted mean of the nodes' fitted `phase` coefficients (see module docstring):
    `n` paper coefficients, up to `n_max` with a form's extra terms (padded with zeros)."""
    coefs: list[list[float]] = []
    weights: list[float] = []
    for i, node in enumerate(nodes):
        entry = node.get(phase) if isinstance(node, dict) else None
        if not isinstance(entry, dict) or entry.get("coef") is None:
            continue  # this node was not fitted in this phase
        where = f"{source}: nodes[{i}].{phase}"
        coef = entry["coef"]
        allowed = f"allowed: a list of {n} to {n_max} finite numbers >= 0 (seconds)"
        if not isinstance(coef, list) or not n <= len(coef) <= n_max:
            raise ConfigError(
                f"{where}.coef: {coef!r:.60} is not {n} to {n_max} coefficients ({allowed})"
            )
        for j, c in enumerate(coef):
            if isinstance(c, bool) or not isinstance(c, int | float) or not math.isfinite(c):
                raise ConfigError(f"{where}.coef[{j}]: {c!r:.40} is not a number ({allowed})")
            if c < 0:
                raise ConfigError(f"{where}.coef[{j}]: {c!r} is negative ({allowed})")
        samples = entry.get("samples", 1)
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
            raise ConfigError(
                f"{where}.samples: {samples!r:.40} is not a count (allowed: an integer >= 0)"
            )
        coefs.append([float(c) for c in coef] + [0.0] * (n_max - len(coef)))
        weights.append(float(samples))
    if not coefs:
        raise ConfigError(f"{source}: no node has fitted {phase} coefficients")
    w = np.asarray(weights) if sum(weights) > 0 else np.ones(len(coefs))
    return tuple(float(x) for x in np.average(np.asarray(coefs), axis=0, weights=w))
