"""Expert parallelism of the torch engine's MoE layers (vLLM's --enable-expert-parallel).

An EP group of e ranks splits the E routed experts of every MoE layer into e contiguous
slices (`ExpertPlacement`, vLLM's linear placement: rank r owns experts
[r·E/e, (r+1)·E/e)); the router and everything outside the experts are replicated. Each
MoE layer then runs as DeepEP's normal-mode dispatch and combine do, with three
collectives of the group (gloo on CPU, NCCL on CUDA):

1. counts: every rank tells every other how many of its tokens it sends there
   (all-to-all of one integer per pair);
2. dispatch: a token goes once to each rank owning at least one of its top-k experts,
   with its k expert ids (-1 where another rank owns the slot) and routing weights;
3. combine: each rank returns, per received token, the weighted sum of its own experts'
   outputs, and the token's origin adds the partial sums up (rank order).

Every rank computes its experts in ascending order, and the origin adds the ranks' partial
sums in rank order, so with top-2 routing (or all of a token's experts on one rank) each
output row is added up in the same order as the single-process layer (`model.MoEFFN`): the
all-to-all itself moves rows exactly. What a layer did on a rank is kept as a `LayerLoad`
(tokens entering it, tokens received after dispatch, distinct local experts run, seconds
in its collectives).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F

from cluster.core import ConfigError

if TYPE_CHECKING:
    from cluster.engines.torch.model import MoEFFN

_EXACT_ID_LIMIT = {torch.float32: 1 << 24, torch.float16: 2048, torch.bfloat16: 256}


@dataclass(frozen=True, slots=True)
class ExpertPlacement:
    """Which routed experts rank `ep_rank` of an EP group of `ep_size` ranks owns."""

    num_experts: int
    ep_size: int
    ep_rank: int

    def __post_init__(self) -> None:
        if self.ep_size < 1 or not 0 <= self.ep_rank < self.ep_size:
            raise ConfigError(
                f"EP rank must be in [0, {self.ep_size}) with ep_size >= 1, got {self.ep_rank}"
            )
        if self.num_experts <= 0 or self.num_experts % self.ep_size:
            raise ConfigError(
                f"expert parallelism needs the {self.num_experts} experts to split evenly "
                f"over {self.ep_size} ranks (choose --ep among the divisors of "
                f"{self.num_experts})"
            )

    @property
    def per_rank(self) -> int:
        return self.num_experts // self.ep_size

    @property
    def first(self) -> int:
        return self.ep_rank * self.per_rank

    def owned(self) -> range:
        return range(self.first, self.first + self.per_rank)

    def owner(self, expert: int) -> int:
        return expert // self.per_rank


class LayerLoad(NamedTuple):
    """One MoE layer of one pass on one rank."""

    tokens_in: int  # this rank's tokens entering the layer
    tokens_received: int  # tokens dispatched to this rank (each once, whatever its slots)
    experts_activated: int  # distinct local experts that ran
    comm_s: float = 0.0  # in the layer's collectives, waits for the other ranks included


class EPComm:
    """The collectives of one EP group (module docstring) and the loads of the current pass."""

    def __init__(self, placement: ExpertPlacement, group: dist.ProcessGroup | None = None) -> None:
        self.placement = placement
        self.group = group
        self.loads: list[LayerLoad] = []
        self.comm_s = 0.0  # in collectives since the last layer was recorded

    def take_loads(self) -> list[LayerLoad]:
        out, self.loads = self.loads, []
        return out

    def _a2a(self, rows: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:
        t0 = time.perf_counter()
        out = rows.new_empty((sum(recv), *rows.shape[1:]))
        dist.all_to_all_single(out, rows.contiguous(), recv, send, group=self.group)
        self.comm_s += time.perf_counter() - t0
        return out

    def dispatch(
        self, rows: torch.Tensor, send_counts: torch.Tensor
    ) -> tuple[torch.Tensor, list[int]]:
        """Send rows[i] to their ranks (`send_counts` per rank, in rank order); returns the
        rows received (in source-rank order) and how many came from each rank."""
        t0 = time.perf_counter()
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        send, recv = send_counts.tolist(), recv_counts.tolist()  # (synchronizes on CUDA)
        self.comm_s += time.perf_counter() - t0
        return self._a2a(rows, send, recv), recv

    def combine(self, rows: torch.Tensor, recv: list[int], send: list[int]) -> torch.Tensor:
        """Return each received row to the rank it came from (the reverse of `dispatch`)."""
        return self._a2a(rows, recv, send)


def check_transport(num_experts: int, dtype: torch.dtype) -> None:
    """Expert ids travel in the hidden states' dtype: they must be exact in it."""
    if num_experts >= _EXACT_ID_LIMIT.get(dtype, 1 << 24):
        raise ConfigError(
            f"expert parallelism in {dtype} carries expert ids exactly only below "
            f"{_EXACT_ID_LIMIT[dtype]}; this model has {num_experts} experts (use float32)"
        )


def ep_moe_forward(moe: MoEFFN, x: torch.Tensor, comm: EPComm) -> tuple[torch.Tensor, int]:
    """One MoE layer over the EP group: route, dispatch, local experts, combine.

    `moe` holds only this rank's experts (`moe.w_*[j]` is expert placement.first + j).
    Returns the layer's output for this rank's tokens and the number of distinct experts
    those tokens were routed to (what the single-process layer reports)."""
    p = comm.placement
    t, d = x.shape
    k = moe.top_k
    probs = moe.router(x).float().softmax(-1)
    weight, expert = probs.topk(k, dim=-1)  # [T, k]
    weight = (weight / weight.sum(-1, keepdim=True)).to(x.dtype)
    routed = int(torch.unique(expert).numel()) if t else 0
    ranks = torch.arange(p.ep_size, device=x.device)
    hit = (expert // p.per_rank)[None] == ranks[:, None, None]  # [R, T, k]
    sends = hit.any(-1)  # [R, T]: token goes to rank r
    dest, token = sends.nonzero(as_tuple=True)  # rank-major, tokens ascending
    ids = torch.where(hit[dest, token], expert[token], -1)
    payload = torch.cat((x[token], ids.to(x.dtype), weight[token]), dim=1)  # [n, d + 2k]
    recv, recv_counts = comm.dispatch(payload, sends.sum(-1))
    xr, rid, rw = recv[:, :d], recv[:, d : d + k].round().long(), recv[:, d + k :]
    partial, activated = local_experts(moe, xr, rid, rw, p.first)
    back = comm.combine(partial, recv_counts, sends.sum(-1).tolist())
    out = torch.zeros_like(x)
    out.index_add_(0, token, back)  # rank order per token
    comm.loads.append(LayerLoad(t, int(recv.shape[0]), activated, comm.comm_s))
    comm.comm_s = 0.0
    return out, routed


def local_experts(
    moe: MoEFFN, xr: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, first: int
) -> tuple[torch.Tensor, int]:
    """This rank's experts over the received tokens `xr` [n, d]: per token the weighted sum
    of its experts held here (`ids` [n, k] global expert ids, -1 or another rank's where not
    ours; `moe.w_*[j]` is expert first + j), and how many distinct experts ran."""
    partial = torch.zeros_like(xr)
    activated = 0
    for j in range(moe.w_gate.shape[0]):  # ascending: each row adds its experts in order
        rows, slots = (ids == first + j).nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        activated += 1
        xs = xr[rows]
        y = (F.silu(xs @ moe.w_gate[j]) * (xs @ moe.w_up[j])) @ moe.w_down[j]
        partial.index_add_(0, rows, y * weights[rows, slots, None])
    return partial, activated
