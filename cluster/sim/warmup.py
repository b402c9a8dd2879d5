"""Online fitting at the end of warmup: fit and freeze each node's models (Alg. E.3 line 1).

During the warmup every node logs its prefill iterations (sum t_uc, sum A, sum t_rst,
duration) and decode iterations (B, duration) in memory; at its end each node's Eq. 1 and
Eq. 2 are fitted by NNLS on its own iterations, falling back to the iterations of all nodes
when its own do not determine the model, and to the profile's coefficients when no data do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from cluster.hardware.profiles import HardwareProfile
from models import DecodeModel, NodeModel, PrefillModel
from models.fitting import (
    DECODE_TERMS,
    PREFILL_TERMS,
    FitError,
    GramStats,
    decode_features,
    fit_from_gram,
    prefill_features,
)


def _total(stats: Sequence[GramStats]) -> GramStats:
    total = stats[0]
    for s in stats[1:]:
        total = total + s
    return total


def fit_node_models(
    profile: HardwareProfile,
    prefill_rows: Mapping[int, list[tuple[float, float, float, float]]],
    decode_rows: Mapping[int, list[np.ndarray]],
    node_ids: Iterable[int],
) -> tuple[dict[int, NodeModel], dict[str, Any]]:
    """Per-node models and a report (coefficients, or why the profile's were kept)."""
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
        for kind, own, terms in (
            ("prefill", pre.get(n), PREFILL_TERMS),
            ("decode", dec.get(n), DECODE_TERMS),
        ):
            candidates = ([own] if own is not None else []) + (
                [_total(pooled[kind])] if pooled[kind] else []
            )
            why = "no samples"
            for stats in candidates:
                try:
                    coef, _ = fit_from_gram(stats, terms)
                except FitError as err:
                    why = str(err)
                    continue
                fitted[kind] = [float(c) for c in coef]
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


class WarmupFit:
    """The iteration logs of the warmup, kept in memory until the fit (then no longer).

    `record_prefill` / `record_decode` are the engine's iteration signals; `fit()` fits and
    freezes the models (once `warm`, nothing more is logged) and keeps the `report`."""

    def __init__(self, profile: HardwareProfile, node_ids: Sequence[int], warm: bool) -> None:
        self.profile = profile
        self.node_ids = list(node_ids)
        self.warm = warm
        self.prefill_rows: dict[int, list[tuple[float, float, float, float]]] = {
            n: [] for n in node_ids
        }
        self.decode_rows: dict[int, list[np.ndarray]] = {n: [] for n in node_ids}
        self.report: dict[str, Any] = {}

    def record_prefill(
        self, node_id: int, sum_uc: float, sum_a: float, sum_rst: float, duration_s: float
    ) -> None:
        if not self.warm:
            self.prefill_rows[node_id].append((sum_uc, sum_a, sum_rst, duration_s))

    def record_decode(self, node_id: int, batch_size: int, durations_s: np.ndarray) -> None:
        if not self.warm:
            n = len(durations_s)
            self.decode_rows[node_id].append(np.column_stack([np.full(n, batch_size), durations_s]))

    def fit(self) -> dict[int, NodeModel]:
        """Fit each node's models on the warmup's iterations; logging stops."""
        models, self.report = fit_node_models(
            self.profile, self.prefill_rows, self.decode_rows, self.node_ids
        )
        self.warm = True
        return models
