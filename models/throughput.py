"""Cluster throughput Theta (paper 000 §5.2, Eq. 5).

Theta(P, D; w_bar, q_bar) = min(sum_{n in P} mu_P,n(w_bar), sum_{n in D} mu_D,n(B = q_bar/|D|)).
Each request passes through both phases, so the slower phase bounds the cluster.
"""

from __future__ import annotations

from collections.abc import Sequence

from models.occupancy import NodeModel
from models.work import MeanWork, RequestWork


def cluster_throughput(
    prefill_nodes: Sequence[NodeModel],
    decode_nodes: Sequence[NodeModel],
    mean_work: RequestWork | MeanWork | MeanWork,
    mean_decode_requests: float,
) -> float:
    """Requests per second the split sustains for the mean work w_bar and decode load q_bar.

    An empty phase gives 0. The decode batch is B = max(q_bar/|D|, 1): a decode node always
    runs at least one request when it runs at all.
    """
    if not prefill_nodes or not decode_nodes:
        return 0.0
    if mean_decode_requests < 0:
        raise ValueError(f"mean_decode_requests (q_bar) must be >= 0, got {mean_decode_requests}")
    prefill = sum(n.prefill_rate(mean_work) for n in prefill_nodes)
    if mean_work.t_out <= 0:
        return prefill
    batch = max(mean_decode_requests / len(decode_nodes), 1.0)
    decode = sum(n.decode_rate(mean_work, batch) for n in decode_nodes)
    return min(prefill, decode)
