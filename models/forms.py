"""Iteration-time model forms chosen by evidence (paper 000 §5.1 Eq. 1-2, App. B.4).

Eq. 1 and Eq. 2 are the "paper" forms. Real engines need more, and each addition is a
linear term, so every form is fitted by the relative-error NNLS of models.fitting:

- prefill "floor": T_P = c0 + c1*max(sum t_uc, tau) + c2*sum A + c3*sum t_rst. Below tau
  tokens the GEMMs read the weights whatever the token count (measured GPUs: flat up to
  ~128-256 tokens), which Eq. 1's straight line cannot follow. tau comes from KNEE_GRID.
- prefill "roofline": the floor plus c4*sum t_c (a chunk's attention reads the KV of every
  cached token: memory-bound for small chunks over long prefixes) plus c5*phi(sum t_uc)
  (an MoE layer reads the weights of every expert the chunk's tokens touch, App. B.3).
- decode "ctx": T_D = d0 + d1*phi(B) + d2*B + d3*sum(ctx). Dense attention reads every
  context token's KV once per iteration (App. B.4), so a batch of long contexts is slower
  than Eq. 2 says, and d2 absorbs the node's mean context when d3 is missing.
- mixed "paper": Eq. 1 + Eq. 2 sharing the constant, for iterations that run prefill
  chunks and decodes together (chunked prefill); mixed "unified": m0 + m1*max(N, tau) +
  m2*sum A + m3*sum ctx + m4*phi(N) + m5*num_seqs + m6*sum t_c with N the tokens of the
  iteration.

Which form a node's iterations support is chosen by models.selection (`choose_form`: K-fold
cross-validation of the relative error from Gram statistics, the simplest form within one
standard error of the best, the refit and its interval).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from models.iteration import DecodeModel, PrefillModel, phi

FloatArray = npt.NDArray[np.float64]
Phase = Literal["prefill", "decode", "mixed"]
# Candidate floors (tokens). Measured GPUs turn compute-bound between 64 and 512 tokens.
KNEE_GRID = (32.0, 64.0, 128.0, 256.0, 512.0, 1024.0)
# Row fields a form may read (sums over the iteration's requests unless noted).
ROW_FIELDS = (
    "t_uc",  # new prefill tokens
    "attn_pairs",  # query-key pairs A of the prefill chunks
    "t_rst",  # tokens restored from host memory
    "t_c",  # cached tokens the prefill chunks attend to
    "batch_size",  # decodes B
    "t_fwd",  # tokens fed per decode (per request, not summed)
    "ctx_tokens",  # context tokens of the decodes
    "num_seqs",  # sequences in the iteration (prefill chunks + decodes)
)


@dataclass(frozen=True, slots=True)
class Form:
    """One model form of one phase: its terms and how a row becomes its design row."""

    name: str
    phase: Phase
    terms: tuple[str, ...]
    knee_tokens: float = 0.0
    description: str = ""
    # 'floor@256' (name@knee) or the name: how fits, reports and profiles key the form.
    label: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        label = f"{self.name}@{self.knee_tokens:g}" if self.knee_tokens else self.name
        object.__setattr__(self, "label", label)

    @property
    def equation(self) -> str:
        """The form written out in its own coefficient names (the key printed under fits)."""
        tau = f"max({{}}, {self.knee_tokens:g})" if self.knee_tokens else "{}"
        if self.phase == "prefill":
            eq = f"c0 + c1*{tau.format('sum t_uc')} + c2*sum A + c3*sum t_rst"
            if self.name == "roofline":
                eq += " + c4*sum t_c + c5*phi(sum t_uc)"
            return eq + (" (Eq. 1)" if self.name == "paper" else "")
        if self.phase == "decode":
            eq = "d0 + d1*phi(B) + d2*B"
            return eq + (" + d3*sum ctx" if self.name == "ctx" else " (Eq. 2)")
        if self.name == "paper":
            return "c0 + c1*sum t_uc + c2*sum A + d1*phi(B) + d2*B (Eq. 1 + Eq. 2)"
        return (
            f"m0 + m1*{tau.format('N')} + m2*sum A + m3*sum ctx + m4*phi(N) + m5*num_seqs"
            " + m6*sum t_c (N: tokens of the iteration)"
        )

    def design(
        self, rows: Mapping[str, FloatArray], top_k: int = 0, num_experts: int = 0
    ) -> FloatArray:
        """Design matrix of the rows (one column per term)."""
        r = {k: np.asarray(v, dtype=np.float64) for k, v in rows.items()}
        n = len(next(iter(r.values())))
        one = np.ones(n)
        zero = np.zeros(n)

        def col(name: str) -> FloatArray:
            if name not in r:
                raise KeyError(f"form {self.label} needs row field {name!r}")
            return r[name]

        def knee(x: FloatArray) -> FloatArray:
            return np.where(x > 0, np.maximum(x, self.knee_tokens), x)

        if self.phase == "prefill":
            uc = col("t_uc")
            cols = [one, knee(uc), col("attn_pairs"), r.get("t_rst", zero)]
            if self.name == "roofline":
                cols += [col("t_c"), phi(uc, top_k, num_experts) * one]
            return np.column_stack(cols)
        b = col("batch_size")
        fwd = r.get("t_fwd", one)
        if self.phase == "decode":
            cols = [one, phi(b, top_k, num_experts, fwd) * one, b]
            if self.name == "ctx":
                cols.append(col("ctx_tokens"))
            return np.column_stack(cols)
        uc = col("t_uc")
        if self.name == "paper":
            ph = phi(b, top_k, num_experts, fwd) * one
            return np.column_stack([one, uc, col("attn_pairs"), ph, b])
        tokens = uc + b * fwd
        return np.column_stack(
            [
                one,
                knee(tokens),
                col("attn_pairs"),
                col("ctx_tokens"),
                phi(tokens, top_k, num_experts) * one,
                col("num_seqs"),
                col("t_c"),
            ]
        )


PREFILL_PAPER = Form("paper", "prefill", ("c0", "c1", "c2", "c3"), description="Eq. 1")
DECODE_PAPER = Form("paper", "decode", ("d0", "d1", "d2"), description="Eq. 2")
DECODE_CTX = Form(
    "ctx", "decode", ("d0", "d1", "d2", "d3"), description="Eq. 2 + d3*sum(ctx): KV read"
)
MIXED_PAPER = Form(
    "paper", "mixed", ("c0", "c1", "c2", "d1", "d2"), description="Eq. 1 + Eq. 2, one constant"
)


def prefill_floor(knee_tokens: float) -> Form:
    return Form(
        "floor",
        "prefill",
        ("c0", "c1", "c2", "c3"),
        float(knee_tokens),
        "Eq. 1 with c1*max(sum t_uc, tau): weight-bound GEMMs below tau tokens",
    )


def prefill_roofline(knee_tokens: float) -> Form:
    return Form(
        "roofline",
        "prefill",
        ("c0", "c1", "c2", "c3", "c4", "c5"),
        float(knee_tokens),
        "floor + c4*sum t_c (KV read) + c5*phi(sum t_uc) (experts touched)",
    )


def mixed_unified(knee_tokens: float) -> Form:
    return Form(
        "unified",
        "mixed",
        ("m0", "m1", "m2", "m3", "m4", "m5", "m6"),
        float(knee_tokens),
        "m0 + m1*max(N, tau) + m2*sum A + m3*sum ctx + m4*phi(N) + m5*num_seqs + m6*sum t_c",
    )


def candidates(phase: Phase, form: str = "auto") -> tuple[Form, ...]:
    """The forms `form` names for a phase: 'auto' (all), 'paper', or a form name."""
    every: dict[Phase, tuple[Form, ...]] = {
        "prefill": (
            PREFILL_PAPER,
            *(prefill_floor(k) for k in KNEE_GRID),
            *(prefill_roofline(k) for k in (0.0, *KNEE_GRID)),
        ),
        "decode": (DECODE_PAPER, DECODE_CTX),
        "mixed": (MIXED_PAPER, *(mixed_unified(k) for k in KNEE_GRID)),
    }
    pool = every[phase]
    if form == "auto":
        return pool
    picked = tuple(f for f in pool if f.name == form or f.label == form)
    if not picked:
        names = sorted({f.name for f in pool} | {"auto"})
        raise ValueError(f"unknown {phase} form {form!r}; forms: {', '.join(names)}")
    return picked


def form_names() -> tuple[str, ...]:
    """Every name `--form` accepts (auto, paper and each phase's own forms)."""
    return ("auto", "paper", "floor", "roofline", "ctx", "unified")


def prefill_model(
    form: Form, coef: Sequence[float], top_k: int = 0, num_experts: int = 0
) -> PrefillModel:
    """The control plane's prefill model of a fitted prefill form."""
    if form.phase != "prefill":
        raise ValueError(f"{form.label} is a {form.phase} form, not a prefill form")
    return PrefillModel.from_coef(
        coef, knee_tokens=form.knee_tokens, top_k=top_k, num_experts=num_experts
    )


def decode_model(
    form: Form, coef: Sequence[float], top_k: int, num_experts: int, t_fwd: float = 1.0
) -> DecodeModel:
    """The control plane's decode model of a fitted decode form (d3 = 0 for Eq. 2)."""
    if form.phase != "decode":
        raise ValueError(f"{form.label} is a {form.phase} form, not a decode form")
    return DecodeModel.from_coef(coef, top_k, num_experts, t_fwd)


def form_by_label(phase: Phase, label: str) -> Form:
    """The form a label such as 'paper', 'ctx' or 'floor@256' names."""
    name, _, knee = label.partition("@")
    if phase == "prefill" and name == "floor":
        return prefill_floor(float(knee or 0.0))
    if phase == "prefill" and name == "roofline":
        return prefill_roofline(float(knee or 0.0))
    if phase == "mixed" and name == "unified":
        return mixed_unified(float(knee or 0.0))
    for f in candidates(phase, "auto"):
        if f.name == name and not f.knee_tokens:
            return f
    raise ValueError(f"unknown {phase} form {label!r}")
