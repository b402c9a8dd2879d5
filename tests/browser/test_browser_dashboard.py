"""Real browser: JupyterLab runs notebook 04, a click on a node's switch button switches it.

`pdlab lab` starts `pdlab serve` (a simulated cluster paced at 20x, or three real torch
engine processes serving cc agents; telemetry into a temp DuckDB) and JupyterLab on a
temporary copy of `notebooks/`. Headless Chromium (Debian's
/usr/bin/chromium driven by Playwright) opens notebook 04, runs all its cells (the notebook
switches one node itself and reads the live run), waits for the dashboard and clicks the
switch button of another node. The test then checks the switch through the REST API and in
the `phase_switches` table (trigger 'manual'), and saves a screenshot of the dashboard to
tests/browser/artifacts/dashboard-{sim,torch}.png (and to $PDLAB_ARTIFACTS when set). Ctrl-C
of `pdlab lab` then leaves no process behind (server, engines, JupyterLab, kernels).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from telemetry import open_reader
from toolkit.client import PdlabClient, free_port, switchable
from toolkit.widgets import figures

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = "04_live_cluster_control.ipynb"
CHROMIUM = "/usr/bin/chromium"
CLUSTERS = {
    "sim": ["--speed", "20", "--nodes", "4", "--split", "2P2D", "--agents", "24"],
    "torch": ["--engines", "torch", "--nodes", "3", "--split", "1P2D", "--agents", "4"],
}
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
# JupyterLab user settings for the test: every cell stays in the DOM (no windowing), no news.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}


def wait_until(pred: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = pred()
        if (got is not None) if not isinstance(got, bool | int) else got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.25)


class Lab:
    def __init__(self, proc: subprocess.Popen[bytes], log: Path, **kw: Any) -> None:
        self.proc, self.log = proc, log
        self.url: str = kw["url"]
        self.token: str = kw["token"]
        self.lab_url: str = kw["lab_url"]
        self.lab_token: str = kw["lab_token"]
        self.db: Path = kw["db"]
        self.engines: str = kw["engines"]

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


@pytest.fixture(params=sorted(CLUSTERS))
def lab(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Lab]:
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    shutil.copy(ROOT / "notebooks" / NOTEBOOK, nbdir / NOTEBOOK)
    settings = tmp_path / "lab-settings"
    for name, value in LAB_SETTINGS.items():
        plugin, file = name.rsplit("/", 1)
        (settings / plugin).mkdir(parents=True, exist_ok=True)
        (settings / plugin / file).write_text(json.dumps(value))
    port, lab_port = free_port(), free_port()
    token, lab_token = "browser-token", "lab-token"
    db = tmp_path / "live.duckdb"
    env = {
        **os.environ,
        "PDLAB_QUICK": "1",
        "JUPYTERLAB_SETTINGS_DIR": str(settings),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
    }
    log = tmp_path / "lab.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "toolkit.cli", "lab", "--notebook-dir", str(nbdir),
             "--port", str(port), "--lab-port", str(lab_port), "--lab-token", lab_token,
             "--token", token, "--db", str(db), *CLUSTERS[request.param], "--no-browser"],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=tmp_path,
        )  # fmt: skip
    lab = Lab(
        proc,
        log,
        url=f"http://127.0.0.1:{port}",
        token=token,
        lab_url=f"http://127.0.0.1:{lab_port}",
        lab_token=lab_token,
        db=db,
        engines=request.param,
    )
    below: list[psutil.Process] = []
    try:
        wait_until(
            lambda: proc.poll() is not None or "pdlab lab: JupyterLab" in log.read_text(),
            180,
            "pdlab lab to start the server and JupyterLab",
        )
        assert proc.poll() is None, lab.tail()
        yield lab
    finally:
        if proc.poll() is None:
            below = psutil.Process(proc.pid).children(recursive=True)
            proc.send_signal(signal.SIGINT)  # Ctrl-C: pdlab lab stops JupyterLab and the server
            try:
                proc.wait(90)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, lab.tail()
    _, alive = psutil.wait_procs(below, timeout=30)
    assert not alive, f"pdlab lab left {[p.cmdline() for p in alive]} running"
    # The server finished the run on the way out: consolidated, no longer live.
    runs = open_reader(db).runs()
    assert runs.height == 1 and not runs["live"][0]


def _kernel_idle(lab: Lab) -> bool:
    r = httpx.get(f"{lab.lab_url}/api/kernels", params={"token": lab.lab_token}, timeout=5)
    return r.status_code == 200 and any(k["execution_state"] == "idle" for k in r.json())


def open_notebook(page: Any, lab: Lab, url: str) -> None:
    """Open `url` and wait for the notebook's first cell.

    CI once timed out here (no cell after 60 s, sim cluster; not reproduced on this
    machine). The cell appears once JupyterLab's front end has loaded and the notebook's
    contents came back from the server; on a loaded runner both wait on CPU. So the wait
    is longer, and a page still without cells is photographed
    (artifacts/open-failed-<engines>.png), its text and JupyterLab's log kept for the
    failure message, and loaded again once: what the test checks starts after this."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    cells = page.locator(".jp-NotebookPanel .jp-Cell").first
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"[:300]))
    page.goto(url)
    try:
        cells.wait_for(timeout=120_000)
        return
    except PlaywrightTimeout:
        _save(page.screenshot(full_page=True), f"open-failed-{lab.engines}.png")
        body = page.locator("body").inner_text(timeout=10_000)[:600]
        seen = f"page text: {body!r}; console: {console[-10:]}; lab log: {lab.tail()[-2000:]}"
        warnings.warn(
            f"no notebook cell after 120 s, loading the page again ({seen})", stacklevel=2
        )
    page.reload()
    try:
        cells.wait_for(timeout=120_000)
    except PlaywrightTimeout:
        raise AssertionError(f"JupyterLab showed no notebook cell twice: {seen}") from None


def _save(shot: bytes, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / name).write_bytes(shot)
    extra = os.environ.get("PDLAB_ARTIFACTS")
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        (Path(extra) / name).write_bytes(shot)


@pytest.mark.browser
def test_notebook_04_dashboard_switch_button_in_chromium(lab: Lab) -> None:
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), f"{CHROMIUM} missing: apt-get install chromium (see .ci/run)"
    client = PdlabClient(lab.url, lab.token)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            page.set_default_timeout(60_000)
            open_notebook(page, lab, f"{lab.lab_url}/lab/tree/{NOTEBOOK}?token={lab.lab_token}")
            # Run All once the notebook's kernel is up (JupyterLab's REST API says so).
            wait_until(lambda: _kernel_idle(lab), 120, "the notebook's kernel to start")
            page.locator("#jp-MainMenu .lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.get_by_text("Run All Cells", exact=True).click()
            done = page.locator(".jp-OutputArea-output", has_text="notebook 04 done")
            done.wait_for(timeout=240_000)

            # The notebook switched one node itself; click another node's button.
            state = client.cluster()
            assert state["switches"] >= 1, state
            node, target = switchable(state)[0]
            button = page.locator(f".pdlab-switch-{node}")
            button.scroll_into_view_if_needed()
            assert button.inner_text().strip() == f"switch node {node} → {target}"
            button.click()
            status = page.locator(".pdlab-status")
            status.get_by_text(f"node {node}: ").wait_for(timeout=60_000)
            assert "✓" in status.inner_text(), status.inner_text()

            # REST: the node switched (drained, then serves the new phase), manually.
            after = client.wait_for_phase(node, target, timeout_s=120)
            assert after["phase"] == target
            # The dashboard shows it after its next refresh.
            page.locator(f".pdlab-switch-{node}", has_text=f"switch node {node} → ").wait_for()
            dashboard = page.locator(".pdlab-dashboard")
            dashboard.evaluate("el => el.scrollIntoView()")
            time.sleep(2.5)  # one more refresh so the split plot includes the switch
            # Taken at once: an element screenshot waits for a still layout, which a dashboard
            # redrawing its plots every refresh on a loaded machine may not give in time.
            box = dashboard.bounding_box()
            assert box is not None
            _save(page.screenshot(clip=box), f"dashboard-{lab.engines}.png")
            _save(page.screenshot(full_page=True), f"notebook04-{lab.engines}.png")
            # Time axes name the cluster's clock: simulated, or wall time for torch engines.
            clock = figures.SIMULATED if lab.engines == "sim" else figures.WALL
            assert dashboard.locator(".xtitle", has_text=clock).count() == 2  # split, latency
            # Below the controls: each node's passes of the last seconds (the pass timeline).
            timeline = page.locator(".pdlab-timeline")
            timeline.scroll_into_view_if_needed()
            timeline.locator(".main-svg").first.wait_for(timeout=60_000)
            box = timeline.bounding_box()
            assert box is not None
            _save(page.screenshot(clip=box), f"dashboard-timeline-{lab.engines}.png")
        finally:
            browser.close()

    # The phase_switches table (read while the server writes it) has the click, trigger manual.
    reader = open_reader(lab.db)

    def clicked() -> Any:
        df = reader.sql(
            "SELECT * FROM phase_switches WHERE node_id = ? AND to_phase = ?", [node, target]
        )
        return None if df.is_empty() else df

    rows = wait_until(clicked, 30, "the switch in phase_switches")
    assert rows.height == 1
    row = rows.row(0, named=True)
    assert row["trigger"] == "manual" and row["from_phase"] != target
    assert row["t_done"] >= row["t_decided"]
    all_rows = reader.table("phase_switches")
    assert all_rows.height >= 2 and set(all_rows["trigger"]) == {"manual"}
    with httpx.Client(base_url=lab.url) as http:
        assert "pdlab_phase_switches_total" in http.get("/metrics").text
