"""A plotly figure in a widget, drawn whole from synced state by every view (SPEC §7).

The dashboard's plots used to be plotly FigureWidgets. Those are anywidgets: the browser
model of each loads plotly's 5 MB ES module, and anywidget gives a model 2 s to load it;
on a browser slower than that (a loaded machine, a page reloaded while the kernel is busy)
the model silently drops every later message from the kernel, so the plots stayed empty
(no traces, no title) while the node cards around them updated. A `LivePlot` is a plain
ipywidgets `Output` whose one output is the figure as a plotly display
(`application/vnd.plotly.v1+json`, drawn by JupyterLab's plotly renderer): the figure is
widget state the standard Output model applies, so the first view, a view drawn again
when its cell scrolls back into view and a view on a reloaded page all draw the figure as
it is now. Each `redraw()` replaces that state, only when the figure changed.
"""

from __future__ import annotations

import json
from typing import Any

import ipywidgets as w
import plotly.graph_objects as go

PLOTLY_MIME = "application/vnd.plotly.v1+json"
_CONFIG = {"displaylogo": False}


class LivePlot(w.Output):
    """Shows `figure`; call `redraw()` after changing it."""

    def __init__(self, figure: go.Figure, **kwargs: Any) -> None:
        height_px = figure.layout.height or 450
        kwargs.setdefault("layout", w.Layout(min_height=f"{height_px}px"))  # no jump on redraw
        super().__init__(**kwargs)
        self.figure = figure
        self._shown: str | None = None
        self._shown_figure: dict[str, Any] = {}
        self.redraw()

    def redraw(self) -> bool:
        """Show the figure as it is now; False when that is what the views already show."""
        spec = self.figure.to_json()
        if spec == self._shown:
            return False
        self._shown = spec
        self._shown_figure = {**json.loads(spec), "config": _CONFIG}
        title = self.figure.layout.title.text or "plot"
        self.outputs = (
            {
                "output_type": "display_data",
                "data": {
                    PLOTLY_MIME: self._shown_figure,
                    "text/plain": f"<plotly figure: {title}>",
                },
                "metadata": {},
            },
        )
        return True

    def shown_figure(self) -> dict[str, Any]:
        """The figure the views draw (data, layout, config), as sent to them."""
        return self._shown_figure
