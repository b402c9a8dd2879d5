"""The dashboard's per-node iteration timeline: the passes of a window of the live run.

Reads the run's database while the server writes it (a `telemetry.TelemetryReader` over
the file and its live segments; the server flushes them every few wall seconds) and draws
`toolkit.plots.timeline.draw_pass_window`: each node's prefill and decode passes with the
requests in each (hover), or the busy share per time bin above `max_passes`. Following the
run, the window is the `window_s` seconds of cluster time up to the last pass written so
far; unticking "follow" keeps the window at "from". A query runs at most every `every_s`
wall seconds (each holds the database for one read, which the writer waits for).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import ipywidgets as w
import plotly.graph_objects as go

from telemetry import TelemetryError, open_reader
from toolkit.plots.common import no_data
from toolkit.plots.timeline import TITLE, draw_pass_window
from toolkit.queries.run import open_run
from toolkit.queries.timeline import last_pass_start, pass_window
from toolkit.widgets.live_plot import LivePlot

MAX_PASSES = 1500  # single passes up to this; a live view stays light


class PassTimelineView:
    """The timeline panel: controls and a `LivePlot`; `update(db, run_id, now)` redraws."""

    def __init__(self, window_s: float = 5.0, every_s: float = 4.0, width: int = 1030) -> None:
        self.every_s = every_s
        self.width = width
        self.window = w.BoundedFloatText(
            value=window_s, min=0.01, max=1e6, step=1.0, description="window (s)",
            layout=w.Layout(width="170px"),
        )  # fmt: skip
        self.follow = w.Checkbox(value=True, description="follow the run", indent=False)
        self.start = w.FloatText(value=0.0, description="from (s)", layout=w.Layout(width="170px"))
        self.note = w.HTML()
        self.figure = no_data(TITLE, None, "waiting for the first passes", height=260)
        self.figure.update_layout(width=width)
        self.plot = LivePlot(self.figure)
        self.plot.add_class("pdlab-timeline")
        self._last = 0.0
        self._key: tuple[Any, ...] | None = None
        for c in (self.window, self.follow, self.start):
            c.observe(lambda _c: self._changed(), names="value")
        self.widget = w.VBox([w.HBox([self.window, self.follow, self.start]), self.note, self.plot])
        self._src: tuple[str, str, float] | None = None

    def _changed(self) -> None:
        self.start.disabled = self.follow.value
        self._last = 0.0  # the next update redraws at once
        if self._src is not None:
            self.update(*self._src)

    def update(self, db: str | None, run_id: str, now: float, force: bool = False) -> bool:
        """Redraw the window ending at `now` (or from `start`); False when nothing was read."""
        if db is None or not Path(db).exists():
            self.note.value = (
                "<small>the pass timeline reads the run's database: not found here</small>"
            )
            return False
        self._src = (db, run_id, now)
        if not force and time.monotonic() - self._last < self.every_s:
            return False
        self._last = time.monotonic()
        span = float(self.window.value)
        try:
            with open_run(open_reader(db), run_id) as run:
                if self.follow.value:  # up to the last pass written (flushed every few s)
                    last = last_pass_start(run)
                    t1 = min(now, last + 1e-6) if last is not None else now
                    t0 = max(t1 - span, 0.0)
                    t1 = max(t1, t0 + 1e-6)
                else:
                    t0 = max(float(self.start.value), 0.0)
                    t1 = t0 + span
                data = pass_window(run, t0, t1, max_passes=MAX_PASSES)
        except (TelemetryError, ValueError) as exc:
            self.note.value = f"<small>pass timeline: {exc}</small>"
            return False
        fig = draw_pass_window(data, height=None)
        fig.update_layout(width=self.width)
        self._show(fig)
        self.note.value = (
            "<small>requests of a decode pass: those decoding on the node then, from the "
            "finished requests' times (in-flight ones appear once done)</small>"
        )
        return True

    def _show(self, fig: go.Figure) -> None:
        self.figure = fig
        self.plot.figure = fig
        self.plot.redraw()
