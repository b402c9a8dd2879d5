"""The MoE shapes of a run's nodes and the batch sizes they decoded at (paper 000 App. B.3).

phi(B) = 1 − (1 − k/E)^(t_fwd·B), the d1 term of Eq. 2, depends on each node's MoE shape (k
routed experts per token of E) and t_fwd, the node's mean logged tokens per request per
decode iteration (1 without speculative decoding). `phi_data` groups the nodes by distinct
(k, E, t_fwd), lists nodes whose shape is invalid (k outside 1..E), and counts decode
iterations per batch size B, so a figure can show where on the curve the run operated.
Where the engines logged `experts_active` (the distinct experts a pass activated, mean over
MoE layers: real routing, e.g. the torch engine), each shape also gets the measured
coverage per B: experts_active / E, mean and standard deviation over its decode iterations.
"""

from __future__ import annotations

from typing import NamedTuple

from toolkit.queries.run import Run


class MeasuredPhi(NamedTuple):
    """Measured expert coverage at one batch size: experts_active / E over the iterations."""

    batch_size: int
    mean: float
    std: float  # 0 for a single iteration
    iterations: int


class MoeShape(NamedTuple):
    top_k: int  # k (0 for a dense model)
    num_experts: int  # E (0 for a dense model)
    t_fwd: float  # mean tokens per request per decode iteration, rounded to 1e-3
    nodes: list[int]
    measured: tuple[MeasuredPhi, ...] = ()  # by B; empty without experts_active


class PhiData(NamedTuple):
    run_id: str
    shapes: list[MoeShape]  # valid shapes (dense included), sorted
    invalid: list[str]  # one note per invalid shape
    batch_hist: list[tuple[int, int]]  # (B, decode iterations at B), by B
    missing: str | None


def phi_data(run: Run) -> PhiData:
    """Distinct MoE shapes with their nodes, and the decode batch-size histogram."""
    nodes = run.nodes()
    if nodes.is_empty():
        missing: str | None = f"no nodes rows (MoE shapes) logged in run {run.run_id}"
        return PhiData(run.run_id, [], [], [], missing)
    tf = dict(
        run.rows(
            "SELECT node_id, avg(t_fwd) FROM decode_iterations WHERE run_id = ? GROUP BY node_id",
            [run.run_id],
        )
    )
    hist = run.rows(
        "SELECT batch_size, count(*) FROM decode_iterations WHERE run_id = ? "
        "GROUP BY batch_size ORDER BY batch_size",
        [run.run_id],
    )
    groups: dict[tuple[int, int, float], list[int]] = {}
    for r in nodes.iter_rows(named=True):
        k, e = int(r["moe_top_k"] or 0), int(r["moe_experts"] or 0)
        t_fwd = round(float(tf.get(r["node_id"]) or 1.0), 3)
        groups.setdefault((k, e, t_fwd), []).append(int(r["node_id"]))
    shapes, invalid = [], []
    for (k, e, t_fwd), ids in sorted(groups.items()):
        if e != 0 and not 0 < k <= e:
            invalid.append(f"nodes {', '.join(map(str, ids))}: invalid MoE shape k={k}, E={e}")
        else:
            shapes.append(MoeShape(k, e, t_fwd, ids, _measured(run, ids, e)))
    batch_hist = [(int(b), int(c)) for b, c in hist]
    missing = None if shapes else ("; ".join(invalid) or "no MoE shapes to plot")
    return PhiData(run.run_id, shapes, invalid, batch_hist, missing)


def _measured(run: Run, nodes: list[int], num_experts: int) -> tuple[MeasuredPhi, ...]:
    if num_experts <= 0:
        return ()
    marks = ", ".join("?" for _ in nodes)
    rows = run.rows(
        "SELECT batch_size, avg(experts_active), coalesce(stddev_samp(experts_active), 0), "
        f"count(*) FROM decode_iterations WHERE run_id = ? AND node_id IN ({marks}) "
        "AND experts_active IS NOT NULL GROUP BY batch_size ORDER BY batch_size",
        [run.run_id, *nodes],
    )
    e = float(num_experts)
    return tuple(MeasuredPhi(int(b), float(m) / e, float(sd) / e, int(n)) for b, m, sd, n in rows)
