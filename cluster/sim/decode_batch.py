"""A node's decode batch kept as columns, so an epoch's bookkeeping runs no Python loop.

An epoch (`cluster.sim.decode`) needs its batch's fewest remaining iterations, its total
context and, at its end, the requests whose last token came out. Done request by request
this costs O(batch) attribute reads per epoch, scattered over the heap, and a run
O(requests x batch). Here the batch has a clock (`DecodeClock`: iterations its requests ran
together); a request joining with L iterations left gets the finish clock `clock + L`, so
its remaining iterations are `decode_end - clock` (`SimRequest.decode_left` reads them so,
for every reader) and one addition advances the whole batch. A heap of finish clocks gives
the fewest remaining iterations and the finishers; the finish clocks, prompt lengths and
last output positions sit in numpy columns in batch order, and the total context is the
reference's sum (`batch_context`) computed in C with the same IEEE operations in the same
order, so it is bit for bit the same float for any `t_acc` (integral or not: the presets'
1.7 and 3.2 included). In situ each numpy call costs a few microseconds (cold caches), so
an epoch makes about five: the context's, and a shift per finisher.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from heapq import heappop, heappush
from operator import itemgetter

import numpy as np

from cluster.sim.entities import DecodeClock, SimRequest

# CPython before 3.12 sums floats left to right in plain double additions, as
# np.add.accumulate does; 3.12's sum() compensates its rounding (Neumaier), and there the
# context is summed by the reference itself.
SEQUENTIAL_SUM = sum([1e100, 1.0, -1e100]) == 0.0
END, T_IN, LAST = 0, 1, 2  # rows of DecodeBatch's columns


def batch_context(batch: Sequence[SimRequest], t_acc: float) -> float:
    """The reference: tokens of KV the batch's requests hold before their next iteration
    (prompt plus tokens generated), summed over the requests in batch order."""
    return float(sum(r.t_in + (r.t_out - 1 - r.decode_left * t_acc) for r in batch))


class DecodeBatch:
    """The decode batch `reqs` of one node (the node's own list, changed in place only
    here) with its clock and columns (module docstring). Requests enter with `join`, leave
    with `leave` (preempted) or by finishing in `advance`; a request out of the batch keeps
    its remaining iterations in `decode_end` (its `decode_clock` is None)."""

    __slots__ = ("_cols", "_heap", "_n", "_seq", "_seqs", "clock", "reqs")

    def __init__(self, reqs: list[SimRequest]) -> None:
        self.clock = DecodeClock()
        self.reqs = reqs
        cap = max(16, 2 * len(reqs))
        # rows: finish clock, prompt tokens, t_out - 1 (integers, exact in float64 < 2**53)
        self._cols = np.empty((3, cap))
        self._seqs: list[int] = []  # join order of reqs (increasing along the batch)
        self._n = 0
        # (finish clock, join order, request); a request that left is dropped when on top
        self._heap: list[tuple[int, int, SimRequest]] = []
        self._seq = 0
        for r in reqs:
            self._attach(r)

    def holds(self, reqs: list[SimRequest]) -> bool:
        """`reqs` is the list this batch keeps, unchanged from outside."""
        return reqs is self.reqs and len(reqs) == self._n

    def _attach(self, r: SimRequest) -> None:
        left = r.decode_left  # from its previous batch's clock, if it still has one
        n = self._n
        cols = self._cols
        if n == cols.shape[1]:
            cols = self._cols = np.concatenate((cols, np.empty_like(cols)), axis=1)
        end = self.clock.iterations + left
        r.decode_clock = None
        r.decode_end = end
        r.decode_clock = self.clock
        cols[END, n] = end
        # the reference's own operands, as `t_in + (t_out - 1 - ...)` converts them
        cols[T_IN, n] = r.t_in
        cols[LAST, n] = r.t_out - 1
        self._seqs.append(self._seq)
        self._n = n + 1
        heappush(self._heap, (end, self._seq, r))
        self._seq += 1

    def join(self, reqs: Sequence[SimRequest]) -> None:
        """`reqs` enter at the end of the batch, in order."""
        for r in reqs:
            self._attach(r)
            self.reqs.append(r)

    def leave(self, r: SimRequest) -> None:
        """`r` leaves the batch (preempted), keeping its remaining iterations."""
        self._remove(self.reqs.index(r))
        self._detach(r)

    def _remove(self, i: int) -> None:
        del self.reqs[i]
        del self._seqs[i]
        n = self._n - 1
        if i < n:
            self._cols[:, i:n] = self._cols[:, i + 1 : n + 1]
        self._n = n

    def _detach(self, r: SimRequest) -> None:
        left = r.decode_end - self.clock.iterations
        r.decode_clock = None
        r.decode_end = left

    def _first_end(self) -> int | None:
        """The smallest finish clock in the batch (None: empty)."""
        heap = self._heap
        while heap:
            end, _, r = heap[0]
            if r.decode_clock is self.clock and r.decode_end == end:
                return end
            heappop(heap)  # it left the batch (or rejoined with another finish clock)
        return None

    def min_left(self) -> int:
        """The fewest remaining iterations of a request in the (non-empty) batch."""
        end = self._first_end()
        if end is None:
            raise ValueError("min_left of an empty decode batch")
        return end - self.clock.iterations

    def context(self, t_acc: float) -> float:
        """`batch_context(self.reqs, t_acc)`, the same float, without a loop in Python."""
        n = self._n
        if not SEQUENTIAL_SUM or n == 0:
            return batch_context(self.reqs, t_acc)
        cols = self._cols
        x = cols[END, :n] - self.clock.iterations  # decode_left (exact)
        x *= t_acc
        np.subtract(cols[LAST, :n], x, out=x)  # t_out - 1 - decode_left * t_acc
        np.add(cols[T_IN, :n], x, out=x)  # t_in + (...)
        return float(np.add.accumulate(x, out=x)[-1])  # left to right, as sum() of 3.11

    def advance(self, iterations: int) -> list[SimRequest]:
        """Every request ran `iterations` more; those with none left leave the batch and
        are returned in batch order (the others keep theirs)."""
        clock = self.clock
        clock.iterations += iterations
        now = clock.iterations
        out: list[tuple[int, SimRequest]] = []
        end = self._first_end()
        while end is not None and end <= now:
            _, seq, r = heappop(self._heap)
            self._detach(r)  # a second entry of r (same finish clock) is now stale
            out.append((seq, r))
            end = self._first_end()
        if not out:
            return []
        seqs, reqs = self._seqs, self.reqs
        at: list[tuple[int, SimRequest]] = []
        for seq, r in out:
            i = bisect_left(seqs, seq)
            if i == len(seqs) or reqs[i] is not r:  # an older entry of a request that
                i = reqs.index(r)  # left and rejoined with the same finish clock
            at.append((i, r))
        at.sort(key=itemgetter(0))  # batch order
        for i, _ in reversed(at):  # the last first: earlier positions stay put
            self._remove(i)
        return [r for _, r in at]
