"""Real browser: the dashboard's plots are filled in every view, the first and a reopened one.

Under `pdlab lab` (the `lab` fixture of test_browser_dashboard.py), headless Chromium runs
notebook 04 (the page ends scrolled to the notebook's end), scrolls the dashboard back into
view, then saves the notebook and reloads the page: JupyterLab reopens the notebook and
draws the dashboard again from the widgets' state in the kernel. Both times the split,
latency and planner plots must hold data and their titles and keep updating (they used to
stay empty, axes -1..6 and no title, while the node cards updated), and the lag badge must
be there, empty exactly while the cluster keeps up (the server's health says how far behind
it is: a loaded machine may not keep up). Screenshots:
tests/browser/artifacts/dashboard_first_view.png and dashboard_reopened.png (and
$PDLAB_ARTIFACTS when set).
"""

from __future__ import annotations

import contextlib
import inspect
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_browser_dashboard import (  # the same lab, browser and helpers
    CHROMIUM,
    CHROMIUM_ARGS,
    NOTEBOOK,
    Lab,
    _kernel_idle,
    _save,
    lab,  # noqa: F401  (the fixture)
    open_notebook,
    wait_until,
)

from toolkit.client import PdlabClient
from toolkit.widgets import ClusterDashboard

# The dashboard's plotly plots above its pass timeline (split, latency, gains; the timeline
# below them is read from the database and has its own test).
PLOTS_JS = """Array.from(document.querySelectorAll('.pdlab-dashboard .js-plotly-plot'))
    .filter(el => !el.closest('.pdlab-timeline'))"""
# Their data: [[len(x), len(y)] per trace] per plot.
PLOT_DATA_JS = f"""() => {PLOTS_JS}
    .map(el => (el.data || []).map(t => [(t.x || []).length, (t.y || []).length]))"""
# Their titles as drawn (plotly's SVG text: title, then the subtitle), in the same order.
PLOT_TITLES_JS = f"""() => {PLOTS_JS}
    .map(el => {{ const t = el.querySelector('.gtitle'); return t ? t.textContent : ''; }})"""
TITLES = ("PD split over time", "Latency of recent requests", "Planner candidates (Eq. 6)")
# The page runs on a CPU this many times slower: a browser that takes seconds to set up a
# widget (plotly's FigureWidget then gave up on its model and drew empty plots) must still
# draw every plot filled.
CPU_SLOWDOWN = 4
FAILURE_SHOT = "dashboard_reopen_failure.png"
LAG_WARN_S = inspect.signature(ClusterDashboard).parameters["lag_warn_s"].default


def saved_with_dashboard(where: Lab) -> bool:
    """The notebook file on disk holds the dashboard's output (JupyterLab's contents API)."""
    r = httpx.get(
        f"{where.lab_url}/api/contents/{NOTEBOOK}", params={"token": where.lab_token}, timeout=10
    )
    outputs = [o for c in r.json()["content"]["cells"] for o in c.get("outputs", [])]
    return any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs)


def reopen(page: Any, attempts: int = 3) -> None:
    """Reload the page until JupyterLab draws the dashboard again.

    On reopening, JupyterLab gives the kernel 4 s to send back the state of every widget;
    on a loaded machine it may miss that and draw "model not found" instead (a race of the
    page, not of the widgets): then the page is opened again."""
    for _ in range(attempts):
        page.reload()
        # Polled with evaluate: the reloaded headless page paints only when asked to.
        got = wait_until(lambda: drawn(page), 120, "the reopened notebook's dashboard")
        if got == "dashboard":
            return
    raise AssertionError(f"the dashboard was not restored in {attempts} reopenings")


def drawn(page: Any) -> str | None:
    if page.locator(".pdlab-dashboard").count() == 1:
        return "dashboard"
    if page.locator(".jp-OutputArea-output", has_text="model not found").count():
        return "model not found"
    return None


def latest_t(page: Any) -> float:
    """The last simulated time on the latency plot's x axis."""
    page.screenshot()  # a frame, so plotly draws
    return float(
        page.evaluate(
            f"() => {{ const el = {PLOTS_JS}[1]; const x = el.data[0].x; return x[x.length - 1]; }}"
        )
    )


def plots_filled(page: Any) -> list[list[list[int]]] | None:
    dashboard = page.locator(".pdlab-dashboard")
    if dashboard.count() != 1:
        return None
    # Into view (JupyterLab may draw only the cells in view); no wait for a still layout.
    dashboard.evaluate("el => el.scrollIntoView()")
    page.screenshot()  # a frame, so plotly draws
    plots = page.evaluate(PLOT_DATA_JS)
    if len(plots) != 3:  # split, latency, gains
        return None
    split, latency, gains = plots
    titles = page.evaluate(PLOT_TITLES_JS)
    titled = all(title.startswith(want) for title, want in zip(titles, TITLES, strict=True))
    # The gains plot is empty until the planner's first window ends (300 s: at the torch
    # cluster's 1x, after the test), and its title says so.
    no_evaluation = titles[2].endswith("no evaluation yet")
    full = all(x > 0 and y > 0 for x, y in split + latency + ([] if no_evaluation else gains))
    return plots if full and titled and len(split) == 2 and len(latency) == 3 else None


def shot(page: Any) -> bytes:
    """A screenshot of the dashboard, taken at once (an element screenshot waits for a still
    layout, which a slowed page redrawing its plots every refresh may not give in time)."""
    dashboard = page.locator(".pdlab-dashboard")
    dashboard.evaluate("el => el.scrollIntoView()")
    box = dashboard.bounding_box()
    assert box is not None
    return bytes(page.screenshot(clip=box))


def badge_agrees(badge: Any, where: Lab) -> bool:
    """The lag badge is empty exactly while the cluster keeps up with the wall clock within
    the dashboard's `lag_warn_s` (a loaded machine may not: then it must say so)."""
    health = PdlabClient(where.url, where.token).health()
    # Real engines are not paced: their health has no lag (as the dashboard reads it).
    behind = (health.get("lag_s") or 0.0) / (health.get("speed") or 1.0) > LAG_WARN_S
    text = badge.inner_text().strip()
    return "behind the wall clock" in text if behind else text == ""


def keeps_updating(page: Any) -> None:
    """The latency plot's last sample moves on (the dashboard refreshes every 2 s)."""
    first_end = latest_t(page)
    wait_until(lambda: latest_t(page) > first_end, 30, "the plots to update")


@pytest.mark.browser
# What this checks is how the browser draws the dashboard's widgets, the same whatever engines
# serve the cluster: it runs on the simulated cluster (the switch-button test runs notebook 04
# over torch engines too; this one over them took four minutes of a 2-core CI machine).
@pytest.mark.parametrize("lab", ["sim"], indirect=True)
def test_notebook_04_dashboard_plots_filled_first_and_reopened(lab: Lab) -> None:  # noqa: F811
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), f"{CHROMIUM} missing: apt-get install chromium (see .ci/run)"
    url = f"{lab.lab_url}/lab/tree/{NOTEBOOK}?token={lab.lab_token}"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            page.set_default_timeout(60_000)
            cdp = page.context.new_cdp_session(page)
            cdp.send("Emulation.setCPUThrottlingRate", {"rate": CPU_SLOWDOWN})
            open_notebook(page, lab, url)
            wait_until(lambda: _kernel_idle(lab), 120, "the notebook's kernel to start")
            page.locator("#jp-MainMenu .lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.get_by_text("Run All Cells", exact=True).click()
            page.locator(".jp-OutputArea-output", has_text="notebook 04 done").wait_for(
                timeout=240_000
            )
            # The page is at the notebook's end: back to the dashboard, its first view.
            wait_until(lambda: plots_filled(page), 60, "the dashboard's plots")
            keeps_updating(page)
            _save(shot(page), "dashboard_first_view.png")
            # Save (outputs reference the widgets), then reopen: a new page, same kernel.
            save = page.locator('.jp-NotebookPanel-toolbar [data-command="docmanager:save"]')

            def saved() -> bool:
                if saved_with_dashboard(lab):
                    return True
                save.first.click()  # (again: a click while the kernel is busy may be lost)
                time.sleep(2.0)
                return False

            wait_until(saved, 60, "the notebook saved with its outputs")
            reopen(page)

            def reopened_plots() -> Any:
                page.screenshot()  # a frame, so plotly draws
                return plots_filled(page)

            plots = wait_until(reopened_plots, 30, "the reopened plots to fill")
            split = plots[0]
            assert split[0][1] >= 2, plots  # the split since the run started, not one refresh
            keeps_updating(page)
            badge = page.locator(".pdlab-lag")
            assert badge.count() == 1
            wait_until(lambda: badge_agrees(badge, lab), 30, "the lag badge to match the lag")
            _save(shot(page), "dashboard_reopened.png")
        except BaseException:
            # The failure's picture, if the page gives one soon: never in place of the failure.
            with contextlib.suppress(Exception):
                _save(page.screenshot(full_page=True, timeout=20_000), FAILURE_SHOT)
            raise
        finally:
            browser.close()
