"""A node's decode batch kept as columns, so an epoch's bookkeeping runs no Python loop.

An epoch (`cluster.sim.decode`) needs its batch's fewest remaining iterations, its total
context and, at its end, the requests whose last token came out. Done request by request
this costs O(batch) attribute reads per epoch, scattered over the heap, and a run
O(requests x batch). Here the batch has a clock (`DecodeClock`: iterations its requests ran
together); a request joining with L iterations left gets the finish clock `clock + L`, so
its remaining iterations are `decode_end - clock` (`SimRequest.decode_left` reads them so,
for every reader) and one addition advances the whole batch. The finish clocks, prompt
lengths and last output positions sit in numpy columns in batch order: the minimum and the
finishers are one comparison each, and the total context is the reference's sum
(`batch_context`) computed in C with the same IEEE operations in the same order, so it is
bit for bit the same float for any `t_acc` (integral or not).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cluster.sim.entities import DecodeClock, SimRequest

# CPython before 3.12 sums floats left to right in plain double additions, as
# np.add.accumulate does; 3.12's sum() compensates its rounding (Neumaier), and there the
# context is summed by the reference itself.
SEQUENTIAL_SUM = sum([1e100, 1.0, -1e100]) == 0.0


def batch_context(batch: Sequence[SimRequest], t_acc: float) -> float:
    """The reference: tokens of KV the batch's requests hold before their next iteration
    (prompt plus tokens generated), summed over the requests in batch order."""
    return float(sum(r.t_in + (r.t_out - 1 - r.decode_left * t_acc) for r in batch))


class DecodeBatch:
    """The decode batch `reqs` of one node (the node's own list, changed in place only
    here) with its clock and columns (module docstring). Requests enter with `join`, leave
    with `leave` (preempted) or by finishing in `advance`; a request out of the batch keeps
    its remaining iterations in `decode_end` (its `decode_clock` is None)."""

    __slots__ = ("_end", "_last", "_min", "_n", "_t_in", "clock", "reqs")

    def __init__(self, reqs: list[SimRequest]) -> None:
        self.clock = DecodeClock()
        self.reqs = reqs
        cap = max(16, 2 * len(reqs))
        self._end = np.empty(cap, np.int64)  # finish clocks
        self._t_in = np.empty(cap)  # prompt tokens
        self._last = np.empty(cap)  # t_out - 1: the output tokens held after the last one
        self._n = 0
        self._min: int | None = None  # the smallest finish clock (None: to compute)
        for r in reqs:
            self._attach(r)

    def holds(self, reqs: list[SimRequest]) -> bool:
        """`reqs` is the list this batch keeps, unchanged from outside."""
        return reqs is self.reqs and len(reqs) == self._n

    def _attach(self, r: SimRequest) -> None:
        left = r.decode_left  # from its previous batch's clock, if it still has one
        n = self._n
        if n == len(self._end):
            cap = 2 * n
            self._end = np.resize(self._end, cap)
            self._t_in = np.resize(self._t_in, cap)
            self._last = np.resize(self._last, cap)
        end = self.clock.iterations + left
        r.decode_clock = None
        r.decode_end = end
        r.decode_clock = self.clock
        self._end[n] = end
        # the reference's own operands: `t_in + (t_out - 1 - ...)` converts them so
        self._t_in[n] = r.t_in
        self._last[n] = r.t_out - 1
        self._n = n + 1
        if self._min is not None and end < self._min:
            self._min = end

    def join(self, reqs: Sequence[SimRequest]) -> None:
        """`reqs` enter at the end of the batch, in order."""
        for r in reqs:
            self._attach(r)
            self.reqs.append(r)

    def leave(self, r: SimRequest) -> None:
        """`r` leaves the batch (preempted), keeping its remaining iterations."""
        i = self.reqs.index(r)
        del self.reqs[i]
        n = self._n - 1
        for col in (self._end, self._t_in, self._last):
            col[i:n] = col[i + 1 : n + 1]
        self._n = n
        self._min = None
        self._detach(r)

    def _detach(self, r: SimRequest) -> None:
        left = r.decode_end - self.clock.iterations
        r.decode_clock = None
        r.decode_end = left

    def _min_end(self) -> int:
        if self._min is None:
            self._min = int(self._end[: self._n].min())
        return self._min

    def min_left(self) -> int:
        """The fewest remaining iterations of a request in the (non-empty) batch."""
        return self._min_end() - self.clock.iterations

    def context(self, t_acc: float) -> float:
        """`batch_context(self.reqs, t_acc)`, the same float, without a loop in Python."""
        n = self._n
        if not SEQUENTIAL_SUM or n == 0:
            return batch_context(self.reqs, t_acc)
        x = (self._end[:n] - self.clock.iterations) * t_acc  # decode_left * t_acc
        np.subtract(self._last[:n], x, out=x)  # t_out - 1 - ...
        np.add(self._t_in[:n], x, out=x)  # t_in + (...)
        return float(np.add.accumulate(x, out=x)[-1])  # left to right, as sum() of 3.11

    def advance(self, iterations: int) -> list[SimRequest]:
        """Every request ran `iterations` more; those with none left leave the batch and
        are returned in batch order (the others keep theirs)."""
        clock = self.clock
        clock.iterations += iterations
        now = clock.iterations
        n = self._n
        if n == 0 or self._min_end() > now:
            return []
        ends = self._end[:n]
        keep = ends > now
        done = np.flatnonzero(~keep).tolist()
        finished = [self.reqs[i] for i in done]
        for i in reversed(done):
            del self.reqs[i]
        m = n - len(done)
        for col in (self._end, self._t_in, self._last):
            col[:m] = col[:n][keep]
        self._n = m
        self._min = None
        for r in finished:
            self._detach(r)
        return finished
