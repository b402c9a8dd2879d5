"""Pure math of agent-adaptive PD serving (paper 000 §5.1–5.3, App. B, E.3).

Iteration-time models (Eq. 1, 2) with the MoE expert-coverage term phi(B), request
occupancy (Eq. 3, 4), cluster throughput Theta (Eq. 5), the planner gain test (Eq. 6),
predicted TTFT with exposed fetch and copy price (Eq. 7, Alg. E.3), and nonnegative
least-squares fitting. Nothing here does I/O or depends on other pdlab packages.
"""

from typing import TYPE_CHECKING

from models.fitting import FitResult, GramStats, fit_from_gram, mape
from models.gain import CandidateGain, gain_test
from models.iteration import DecodeModel, PrefillModel, phi
from models.occupancy import NodeModel
from models.throughput import cluster_throughput
from models.ttft import FetchModel, predicted_ttft
from models.work import MeanWork, RequestWork, attn_pairs

if TYPE_CHECKING:
    from models.estimators import DecodeRegressor, PrefillRegressor


def __getattr__(name: str) -> object:
    # scikit-learn is imported only by those who use the estimators (it takes seconds).
    if name in ("PrefillRegressor", "DecodeRegressor"):
        from models import estimators

        return getattr(estimators, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CandidateGain",
    "DecodeModel",
    "DecodeRegressor",
    "FetchModel",
    "FitResult",
    "GramStats",
    "MeanWork",
    "NodeModel",
    "PrefillModel",
    "PrefillRegressor",
    "RequestWork",
    "attn_pairs",
    "cluster_throughput",
    "fit_from_gram",
    "gain_test",
    "mape",
    "phi",
    "predicted_ttft",
]
