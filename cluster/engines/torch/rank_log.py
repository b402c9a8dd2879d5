"""What one DP rank of a torch engine group did, pass by pass, as JSON lines (SPEC §3).

Each rank of a DP×EP group (`dp_rank`) appends to `rank{r}.jsonl` in the group's log
directory; every line is one row `{"table": ..., ...}` of

- `pass`: every forward pass, real or dummy, in order — `pass_id` (per rank), the DP
  `wave` and `step` within it (equal on every rank at the same pass: the lockstep), `kind`
  (prefill, decode or dummy), `iter_id` (the rank's own prefill or decode iteration
  counter, as the iteration tables number them), `t_start` (monotonic clock, s) and
  `duration_s` (the runner's timed span, waits at the all-to-all included), and what the
  pass held: `num_reqs`, `t_uc`, `t_c`, `attn_pairs`, `t_rst` (prefill), `batch_size`,
  `ctx_tokens` (decode), `experts_active` (distinct experts this rank's tokens were
  routed to, mean over MoE layers);
- `layer`: per pass and MoE layer, `tokens_in` (this rank's tokens), `tokens_received`
  (tokens dispatched to this rank), `experts_activated` (its own experts that ran) and
  `comm_s` (seconds in the layer's collectives, waits for the other ranks included);
- `request`: per request the rank served — `rid`, `t_arrival` (handed to the rank's
  scheduler by its HTTP server: the engine's arrival, as vLLM's engine core receives a
  request), `t_queued` (taken in by the scheduler loop, between passes),
  `t_prefill_start`, `t_first_token`, `t_done`, `t_in`, `t_c`, `t_out`, `finish`;
- `meta` (first line): the rank, its worker id, and a (wall, monotonic) clock pair.

Rows are buffered and written at most once a second from the scheduler thread, and at stop.
All ranks of a group share the host's monotonic clock (loopback groups only).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


class RankLog:
    """Buffered JSON-lines rows of one rank (module docstring)."""

    def __init__(self, directory: str | Path, rank: int, worker_id: str = "") -> None:
        self.path = Path(directory) / f"rank{rank}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self._rows: list[dict[str, Any]] = []
        self._last_flush = time.monotonic()
        self.path.write_text("")
        self.add("meta", worker_id=worker_id, wall_s=time.time(), monotonic_s=time.monotonic())

    def add(self, table: str, **row: Any) -> None:
        self._rows.append({"table": table, "rank": self.rank, **row})

    def maybe_flush(self, every_s: float = 1.0) -> None:
        if time.monotonic() - self._last_flush >= every_s:
            self.flush()

    def flush(self) -> None:
        self._last_flush = time.monotonic()
        if not self._rows:
            return
        rows, self._rows = self._rows, []
        with self.path.open("a") as f:
            f.write("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))


def read_rank_logs(directory: str | Path) -> dict[str, list[dict[str, Any]]]:
    """Every rank's rows of a group's log directory, by table (rank order, then line order)."""
    out: dict[str, list[dict[str, Any]]] = {}
    paths = sorted(Path(directory).glob("rank*.jsonl"), key=lambda p: int(p.stem[4:]))
    for path in paths:
        lines = path.read_text().split("\n")
        for line in lines[:-1]:  # the last piece is "" or a line being written now
            if line:
                row = json.loads(line)
                out.setdefault(row.pop("table"), []).append(row)
    return out
