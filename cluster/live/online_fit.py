"""Online fits of the iteration-time models of live engines (paper 000 §5.1, Eq. 1–2; App. E.3).

The router predicts TTFT (Eq. 7) and the planner the throughput (Eq. 5) from per-node
models; on a live cluster they start from a hardware profile and must converge to the
engines' own timings ("within a minute of online learning", paper 000 §5.3). `OnlineFitter`
keeps each node's most recent forward passes (the rows the FPM collector writes to
DuckDB) and refits Eq. 1 and Eq. 2 by relative-error NNLS (`models.fitting`), also
remeasuring t_bar (mean new tokens per prefill pass). A node that logged too few passes
of a phase keeps that phase's previous model; a failed fit keeps it too and says why.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from cluster.wire.iteration_rows import DecodeRow, PrefillRow
from models import DecodeModel, NodeModel, PrefillModel
from models.estimators import DecodeRegressor, PrefillRegressor
from models.fitting import FitError

log = logging.getLogger(__name__)


class Refit(NamedTuple):
    """One node's refit: the new model, which phases changed, samples and training MAPE."""

    model: NodeModel
    phases: tuple[str, ...]
    samples: dict[str, int]
    mape: dict[str, float]
    problems: tuple[str, ...]


def _mape(y: np.ndarray, pred: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - y) / y))


class OnlineFitter:
    """Recent passes per node and phase; `refit(node, current)` returns the updated model."""

    def __init__(
        self, top_k: int, num_experts: int, window: int = 5000, min_rows: int = 20
    ) -> None:
        if min_rows < 5:
            raise ValueError(f"min_rows must be >= 5 (four prefill terms), got {min_rows}")
        self.top_k = top_k
        self.num_experts = num_experts
        self.window = window
        self.min_rows = min_rows
        self._prefill: dict[int, deque[tuple[float, float, float, float]]] = {}
        self._decode: dict[int, deque[tuple[float, float, float]]] = {}
        self._reported: set[str] = set()

    def add_prefill(self, node: int, row: PrefillRow) -> None:
        if row.duration_s > 0:
            q = self._prefill.setdefault(node, deque(maxlen=self.window))
            q.append((row.t_uc, row.attn_pairs, row.t_rst, row.duration_s))

    def add_decode(self, node: int, row: DecodeRow) -> None:
        if row.duration_s > 0:
            q = self._decode.setdefault(node, deque(maxlen=self.window))
            q.append((row.batch_size, row.t_fwd, row.duration_s))

    def rows(self, node: int) -> dict[str, int]:
        return {
            "prefill": len(self._prefill.get(node, ())),
            "decode": len(self._decode.get(node, ())),
        }

    def refit(self, node: int, current: NodeModel) -> Refit | None:
        """Refit the phases with at least `min_rows` passes; None when nothing changed."""
        model = current
        phases: list[str] = []
        samples: dict[str, int] = {}
        mape: dict[str, float] = {}
        problems: list[str] = []
        pre = self._prefill.get(node)
        if pre is not None and len(pre) >= self.min_rows:
            a = np.array(pre, dtype=np.float64)
            try:
                reg = PrefillRegressor().fit(a[:, :3], a[:, 3])
            except FitError as e:
                problems.append(f"node {node} prefill: {e}")
            else:
                model = replace(
                    model,
                    prefill=PrefillModel.from_coef(reg.coef_.tolist()),
                    mean_new_tokens=max(float(a[:, 0].mean()), 1.0),
                )
                phases.append("prefill")
                samples["prefill"] = len(a)
                mape["prefill"] = _mape(a[:, 3], reg.predict(a[:, :3]))
        dec = self._decode.get(node)
        if dec is not None and len(dec) >= self.min_rows:
            a = np.array(dec, dtype=np.float64)
            try:
                dreg = DecodeRegressor(self.top_k, self.num_experts).fit(a[:, :2], a[:, 2])
            except FitError as e:
                problems.append(f"node {node} decode: {e}")
            else:
                d = DecodeModel.from_coef(
                    dreg.coef_.tolist(), self.top_k, self.num_experts, float(a[:, 1].mean())
                )
                model = replace(model, decode=d)
                phases.append("decode")
                samples["decode"] = len(a)
                mape["decode"] = _mape(a[:, 2], dreg.predict(a[:, :2]))
        if not phases and not problems:
            return None
        return Refit(model, tuple(phases), samples, mape, tuple(problems))

    def refit_all(self, models: Mapping[int, NodeModel]) -> dict[int, Refit]:
        """`refit` of every node of `models`: the refits that changed a phase (problems of
        the others are logged; their previous models stay)."""
        out: dict[int, Refit] = {}
        for n, current in models.items():
            r = self.refit(n, current)
            if r is None:
                continue
            for problem in r.problems:  # each problem once; its repeats at debug level
                level = logging.DEBUG if problem in self._reported else logging.WARNING
                self._reported.add(problem)
                log.log(level, "online refit: %s (the previous model stays)", problem)
            if r.phases:
                out[n] = r
        return out
