"""Progress bars for long work in notebooks (tqdm) around library calls that take a callback."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from tqdm.auto import tqdm


def tqdm_callback(
    total: float, desc: str, unit: str = "sim-s"
) -> tuple[Callable[[float], None], Any]:
    """A `progress(t)` callback that moves a tqdm bar to `t` of `total`, and the bar."""
    bar = tqdm(
        total=total,
        desc=desc,
        unit=unit,
        bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} {unit} [{elapsed}]",
    )

    def update(t: float) -> None:
        bar.n = min(t, total)
        bar.refresh()

    return update, bar


def simulate(
    cfg: Any, db: str | os.PathLike[str] | None = None, run_id: str | None = None
) -> dict[str, Any]:
    """`cluster.sim.runner.simulate` with a tqdm bar over simulated time."""
    from cluster.sim.runner import simulate as run

    update, bar = tqdm_callback(cfg.duration_s, f"{cfg.workload} {cfg.split}")
    try:
        return run(cfg, db, run_id, progress=update)
    finally:
        bar.close()
