"""The work of a request, w = (t_uc, t_c, t_out, t_acc) (paper 000 §5.1, Table 1).

`attn_pairs` is the query-key pair count A = t_uc*t_c + t_uc*(t_uc+1)/2 of one request or
one prefill chunk, where t_c counts every earlier token whose KV exists (cached prefix plus
earlier chunks). It accepts scalars or numpy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import overload

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


@overload
def attn_pairs(t_uc: float, t_c: float) -> float: ...
@overload
def attn_pairs(t_uc: FloatArray, t_c: FloatArray | float) -> FloatArray: ...
def attn_pairs(t_uc, t_c):  # type: ignore[no-untyped-def,unused-ignore]
    """A = t_uc * t_c + t_uc * (t_uc + 1) / 2 (causal attention of t_uc new tokens)."""
    if isinstance(t_uc, np.ndarray) or isinstance(t_c, np.ndarray):
        uc = np.asarray(t_uc, dtype=np.float64)
        return uc * np.asarray(t_c, dtype=np.float64) + uc * (uc + 1.0) / 2.0
    return float(t_uc) * float(t_c) + float(t_uc) * (float(t_uc) + 1.0) / 2.0


@dataclass(frozen=True, slots=True)
class RequestWork:
    """Work of one request: uncached input, cached prefix, output, accepted tokens/iteration.

    `t_rst` (tokens restored from host memory) is the part of `t_c` that is not in GPU
    memory; Eq. 3 uses the node's restore fraction f instead when it is unknown.
    """

    t_uc: float
    t_c: float = 0.0
    t_out: float = 0.0
    t_acc: float = 1.0

    def __post_init__(self) -> None:
        for name in ("t_uc", "t_c", "t_out"):
            if getattr(self, name) < 0:
                raise ValueError(f"RequestWork.{name} must be >= 0, got {getattr(self, name)}")
        if self.t_acc <= 0:
            raise ValueError(f"RequestWork.t_acc must be > 0, got {self.t_acc}")

    @property
    def t_in(self) -> float:
        return self.t_uc + self.t_c

    @property
    def attn_pairs(self) -> float:
        return attn_pairs(self.t_uc, self.t_c)


@dataclass(frozen=True, slots=True)
class MeanWork:
    """Average work of the requests of a planning slice (paper 000 §5.2, w_bar).

    Eq. 3 is linear in t_uc, A and t_c, so averaging A itself (not A of the mean lengths)
    makes the mean occupancy exact.
    """

    t_uc: float
    attn_pairs: float
    t_c: float
    t_out: float
    t_acc: float = 1.0

    @property
    def t_in(self) -> float:
        return self.t_uc + self.t_c
