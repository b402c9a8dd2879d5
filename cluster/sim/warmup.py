"""Online fitting at the end of warmup: fit and freeze each node's models (Alg. E.3 line 1).

During the warmup every node logs its prefill iterations (sum t_uc, sum A, sum t_rst,
duration) and decode iterations (B, duration) in memory; at its end each node's Eq. 1 and
Eq. 2 are fitted by NNLS on its own iterations, falling back to the iterations of all nodes
when its own do not determine the model, and to the profile's coefficients when no data do.

With a `form` other than "paper" (`pdlab simulate --form auto|ctx|floor|roofline`), each
node's form is chosen by evidence as `pdlab fit --form` does (models.selection.choose_form:
5-fold cross-validation over time blocks of the node's own warmup iterations, the simplest
form within one standard error of the best); the planner then prices Eq. 3-5 with the chosen
forms, and the router prices prefill with them (SimConfig.prefill_forms).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from cluster.hardware.profiles import HardwareProfile
from models import DecodeModel, NodeModel, PrefillModel
from models.fitting import FitError, GramStats, decode_features, prefill_features
from models.forms import DECODE_PAPER, PREFILL_PAPER, Form, candidates, decode_model, prefill_model
from models.forms import Phase as FormPhase
from models.selection import Candidate, choose_form

_FOLDS = 5
_BLOCKS = 10  # time blocks of a node's warmup iterations (the CV's buckets)


def fit_node_models(
    profile: HardwareProfile,
    prefill_rows: Mapping[int, list[tuple[float, float, float, float, float]]],
    decode_rows: Mapping[int, list[np.ndarray]],
    node_ids: Iterable[int],
    form: str = "paper",
) -> tuple[dict[int, NodeModel], dict[str, Any]]:
    """Per-node models and a report (coefficients, or why the profile's were kept).

    Prefill rows are (sum t_uc, sum A, sum t_rst, duration, sum t_c); decode rows arrays of
    (B, duration, context tokens) per iteration."""
    if form != "paper":
        return _fit_forms(profile, prefill_rows, decode_rows, node_ids, form)
    pre: dict[int, GramStats] = {}
    dec: dict[int, GramStats] = {}
    for n, rows in prefill_rows.items():
        if rows:
            a = np.asarray(rows, dtype=np.float64)
            pre[n] = GramStats.from_rows(prefill_features(a[:, 0], a[:, 1], a[:, 2]), a[:, 3])
    for n, chunks in decode_rows.items():
        if chunks:
            a = np.concatenate(chunks)
            x = decode_features(a[:, 0], profile.t_fwd, profile.top_k, profile.num_experts)
            dec[n] = GramStats.from_rows(x, a[:, 1])
    pooled = {"prefill": list(pre.values()), "decode": list(dec.values())}
    oracle = profile.node_model()
    models: dict[int, NodeModel] = {}
    report: dict[str, Any] = {}
    for n in node_ids:
        fitted: dict[str, list[float]] = {}
        for kind, own, form in (
            ("prefill", pre.get(n), PREFILL_PAPER),
            ("decode", dec.get(n), DECODE_PAPER),
        ):
            rows = ([[own]] if own is not None else []) + ([pooled[kind]] if pooled[kind] else [])
            why = "no samples"
            for buckets in rows:  # the node's own iterations, else those of all nodes
                try:
                    fit = choose_form([Candidate(form, buckets)])
                except FitError as err:
                    why = str(err)
                    continue
                fitted[kind] = list(fit.coef)
                break
            report[f"{n}.{kind}"] = fitted.get(kind, f"{why}: profile coefficients kept")
        p = PrefillModel.from_coef(fitted["prefill"]) if "prefill" in fitted else oracle.prefill
        d = (
            DecodeModel.from_coef(
                fitted["decode"], profile.top_k, profile.num_experts, profile.t_fwd
            )
            if "decode" in fitted
            else oracle.decode
        )
        models[n] = NodeModel(p, d, mean_new_tokens=float(profile.chunk_tokens))
    return models, report


def _rows(
    prefill_rows: list[tuple[float, float, float, float, float]], decode_rows: list[np.ndarray]
) -> tuple[dict[str, np.ndarray], np.ndarray, dict[str, np.ndarray], np.ndarray]:
    """Row fields (models.forms.ROW_FIELDS) and durations of a node's warmup iterations."""
    a = np.asarray(prefill_rows, dtype=np.float64).reshape(-1, 5)
    pre = {"t_uc": a[:, 0], "attn_pairs": a[:, 1], "t_rst": a[:, 2], "t_c": a[:, 4]}
    d = np.concatenate(decode_rows) if decode_rows else np.zeros((0, 3))
    dec = {"batch_size": d[:, 0], "ctx_tokens": d[:, 2]}
    return pre, a[:, 3], dec, d[:, 1]


def _pool(kind: str, form: str) -> tuple[Form, ...]:
    """The candidate forms of a phase; Eq. 1/2 where `form` names another phase's form."""
    phase: FormPhase = "prefill" if kind == "prefill" else "decode"
    try:
        return candidates(phase, form)
    except ValueError:
        return candidates(phase, "paper")


def _choose(
    forms: tuple[Form, ...], rows: dict[str, np.ndarray], y: np.ndarray, profile: HardwareProfile
) -> tuple[Form, tuple[float, ...], dict[str, float]]:
    """The form `choose_form` keeps on time blocks of the rows, and every form's CV error."""
    blocks = np.arange(len(y)) * _BLOCKS // max(len(y), 1)
    scored = []
    for f in forms:
        x = f.design(rows, profile.top_k, profile.num_experts)
        scored.append(
            Candidate(
                f, [GramStats.from_rows(x[blocks == b], y[blocks == b]) for b in range(_BLOCKS)]
            )
        )
    choice = choose_form(scored, folds=_FOLDS, always=(forms[0].terms[0],), score_one=True)
    return choice.form, choice.coef, {s.form.label: s.cv_rmse for s in choice.scores}


def _fit_forms(
    profile: HardwareProfile,
    prefill_rows: Mapping[int, list[tuple[float, float, float, float, float]]],
    decode_rows: Mapping[int, list[np.ndarray]],
    node_ids: Iterable[int],
    form: str,
) -> tuple[dict[int, NodeModel], dict[str, Any]]:
    """Per-node forms chosen by cross-validation; the pooled rows of all nodes where a node's
    own cannot decide, the profile's paper coefficients where nothing can."""
    t_fwd = profile.t_fwd
    oracle = profile.node_model()
    own = {n: _rows(prefill_rows.get(n, []), decode_rows.get(n, [])) for n in node_ids}
    pooled = _rows(
        [r for rows in prefill_rows.values() for r in rows],
        [c for chunks in decode_rows.values() for c in chunks],
    )
    models: dict[int, NodeModel] = {}
    report: dict[str, Any] = {}
    for n in node_ids:
        p, d = oracle.prefill, oracle.decode
        for kind in ("prefill", "decode"):
            forms = _pool(kind, form)
            why = "no samples"
            for pre, y_pre, dec, y_dec in (own[n], pooled):
                rows, y = (pre, y_pre) if kind == "prefill" else (dec, y_dec)
                rows = {**rows, "t_fwd": np.full(len(y), t_fwd)}
                try:
                    chosen, coef, cv = _choose(forms, rows, y, profile)
                except (FitError, ValueError) as err:
                    why = str(err)
                    continue
                if kind == "prefill":
                    p = prefill_model(chosen, coef, profile.top_k, profile.num_experts)
                else:
                    d = decode_model(chosen, coef, profile.top_k, profile.num_experts, t_fwd)
                report[f"{n}.{kind}"] = {"form": chosen.label, "coef": list(coef), "cv_rmse": cv}
                break
            else:
                report[f"{n}.{kind}"] = f"{why}: profile coefficients kept"
        models[n] = NodeModel(p, d, mean_new_tokens=float(profile.chunk_tokens))
    return models, report


class WarmupFit:
    """The iteration logs of the warmup, kept in memory until the fit (then no longer).

    `record_prefill` / `record_decode` are the engine's iteration signals; `fit()` fits and
    freezes the models (once `warm`, nothing more is logged) and keeps the `report`."""

    def __init__(
        self, profile: HardwareProfile, node_ids: Sequence[int], warm: bool, form: str = "paper"
    ) -> None:
        self.profile = profile
        self.form = form
        self.node_ids = list(node_ids)
        self.warm = warm
        self.prefill_rows: dict[int, list[tuple[float, float, float, float, float]]] = {
            n: [] for n in node_ids
        }
        self.decode_rows: dict[int, list[np.ndarray]] = {n: [] for n in node_ids}
        self.report: dict[str, Any] = {}

    def record_prefill(
        self,
        node_id: int,
        sum_uc: float,
        sum_a: float,
        sum_rst: float,
        duration_s: float,
        sum_c: float = 0.0,
    ) -> None:
        if not self.warm:
            self.prefill_rows[node_id].append((sum_uc, sum_a, sum_rst, duration_s, sum_c))

    def record_decode(
        self,
        node_id: int,
        batch_size: int,
        durations_s: Sequence[float],
        ctx_tokens: Sequence[float],
    ) -> None:
        if not self.warm:
            n = len(durations_s)
            self.decode_rows[node_id].append(
                np.column_stack([np.full(n, batch_size), durations_s, ctx_tokens])
            )

    def forms(self) -> dict[str, str]:
        """ "node.phase" -> the chosen form's label, or why the profile's model was kept."""
        return {
            k: v["form"] if isinstance(v, dict) and "form" in v else str(v)
            for k, v in self.report.items()
        }

    def fit(self) -> dict[int, NodeModel]:
        """Fit each node's models on the warmup's iterations; logging stops."""
        models, self.report = fit_node_models(
            self.profile, self.prefill_rows, self.decode_rows, self.node_ids, self.form
        )
        self.warm = True
        return models
