"""phi(B) on measured MoE kernels: Eq. 2's MoE term fitted on AIConfigurator's MoE tables.

Each MoE table of a (system, backend) holds, per expert shape (hidden, intermediate, top-k,
experts), dtype, MoE TP/EP and routing distribution (balanced, power_law_1.01,
power_law_1.2), one layer's time by the tokens entering it. `moe_phi_report` fits the MoE
term t(T) = m0 + m1 phi(T) + m2 T (models.expert_skew) to every such curve twice: with App.
B.3's uniform phi (skew 0) and with the skew chosen by leave-one-out error, and reports per
load shape (distribution) the mean leave-one-out MAPE before and after, and the fitted
skews. A profile's MoE term uses the skew fitted on the table it prices with
(`profile_skew`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from cluster.hardware.aiconfigurator_db import KernelDatabase
from models.expert_skew import MoeTermFit, fit_moe_term
from models.fitting import FitError


def curves(
    db: KernelDatabase, dtype: str | None = None
) -> dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]]:
    """Every MoE curve of the database: key (hidden, inter, top_k, experts, tp, ep, dtype,
    distribution) -> (tokens, seconds), the fastest kernel per token count."""
    import pyarrow.parquet as pq

    path, _ = db.table_path("moe", "moe_perf.parquet")
    cols = ["moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts",
            "moe_tp_size", "moe_ep_size", "distribution", "latency"]  # fmt: skip
    t = pq.read_table(path, columns=cols, filters=[("moe_dtype", "=", dtype)] if dtype else None)
    d = {c: t.column(c).to_numpy(zero_copy_only=False) for c in cols}
    best: dict[tuple[Any, ...], dict[float, float]] = defaultdict(dict)
    for i in range(t.num_rows):
        key = (int(d["hidden_size"][i]), int(d["inter_size"][i]), int(d["topk"][i]),
               int(d["num_experts"][i]), int(d["moe_tp_size"][i]), int(d["moe_ep_size"][i]),
               str(d["moe_dtype"][i]), str(d["distribution"][i]))  # fmt: skip
        tok, sec = float(d["num_tokens"][i]), float(d["latency"][i]) * 1e-3
        row = best[key]
        row[tok] = min(row.get(tok, np.inf), sec)
    return {k: (np.array(sorted(r)), np.array([r[x] for x in sorted(r)])) for k, r in best.items()}


def moe_phi_report(db: KernelDatabase, dtype: str | None = None) -> dict[str, Any]:
    """Per load shape: curves fitted, mean cross-validated MAPE with uniform phi and with the fitted
    skew, and the fitted skews' median and quartiles (module docstring)."""
    per: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for key, (tok, sec) in curves(db, dtype).items():
        top_k, experts, dist = key[2], key[3], key[7]
        try:
            before = fit_moe_term(tok, sec, top_k, experts, skew=0.0)
            after = fit_moe_term(tok, sec, top_k, experts)
        except FitError:
            continue
        per[dist]["before"].append(before.cv_mape)
        per[dist]["after"].append(after.cv_mape)
        per[dist]["skew"].append(after.skew)
    out: dict[str, Any] = {"system": db.system, "backend": db.backend, "load_shapes": {}}
    for dist, v in sorted(per.items()):
        sk = np.array(v["skew"])
        out["load_shapes"][dist] = {
            "curves": len(sk),
            "mape_uniform_phi": float(np.mean(v["before"])),
            "mape_skewed_phi": float(np.mean(v["after"])),
            "skew_median": float(np.median(sk)),
            "skew_quartiles": [float(np.quantile(sk, 0.25)), float(np.quantile(sk, 0.75))],
        }
    return out


def profile_skew(tokens: np.ndarray, seconds: np.ndarray, top_k: int, experts: int) -> MoeTermFit:
    """The MoE term (and its skew) of the one curve a profile prices with."""
    return fit_moe_term(tokens, seconds, top_k, experts)
