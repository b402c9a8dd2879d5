"""Rich tables of where a twin's interval comes from: its sources and its parameters.

`sources_table`: per source (requests, profile, each ranged parameter) and mean metric
(TTFT, TPOT, E2E), how far it lets log(sim / real) go down and up, in percent (x 100 of the
log spread, ~ percent for small spreads), and the combined interval of the error; the
sources add in quadrature (toolkit.twin.metrics.combined_interval). The parameters
themselves (value, source, range) are printed by `pdlab twin` (toolkit.twin.parameters).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rich.table import Table

MEAN_METRICS = ("ttft_mean_s", "tpot_mean_s", "e2e_mean_s")


def _side(x: float, sign: str) -> str:
    if not math.isfinite(x):
        return "not known"
    return "0" if round(100 * x, 1) == 0 else f"{sign}{100 * x:.1f}"


def _spread(down: float, up: float) -> str:
    return f"{_side(down, '-')} / {_side(up, '+')}"


def sources_table(sources: Sequence[Any], metrics: dict[str, Any]) -> Table:
    table = Table(
        title="where the 95% interval comes from (% of the metric, down / up)",
        caption="sources add in quadrature on each side; 'profile' is the replay on draws of "
        "the operator grid's held-out error (also the replay's seed spread)",
    )
    table.add_column("source", justify="left")
    table.add_column("kind", justify="left")
    for k in MEAN_METRICS:
        table.add_column(k.removesuffix("_s"), justify="right")
    for s in sources:
        table.add_row(s.name, s.kind, *(_spread(*s.spread[k]) for k in MEAN_METRICS))
    row = ["interval of the error", ""]
    for k in MEAN_METRICS:
        lo, hi = metrics[k].ci95
        known = math.isfinite(hi) and lo > -1.0
        row.append(f"[{100 * lo:+.1f}%, {100 * hi:+.1f}%]" if known else "not known")
    table.add_row(*row, style="bold")
    return table
