"""Real browser: the figures a user sees, drawn by headless Chromium and saved as screenshots.

- `pdlab report` of a request-only imported run (the committed copy of a real vLLM run):
  only the figures it can fill (latency distributions with TPOT, running/waiting series)
  and the note of what is left out; of a simulated PD cluster run: every figure, the
  per-node iteration timeline (Gantt) among them, whose hover names a pass's requests;
- notebook 05's multi-seed figure (the notebook executed at its quick size, its figure
  output drawn by plotly.js as JupyterLab's renderer draws it).

Screenshots go to tests/browser/artifacts/ (and $PDLAB_ARTIFACTS when set): report-request-
only.png, report-pd-cluster.png, gantt.png, gantt-hover.png, nb05-seeds.png, lag-badge.png.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from plotly.offline import get_plotlyjs

from cluster.data import BUNDLED
from cluster.sim.runner import simulate
from cluster.sim.simulator import SimConfig
from toolkit.importers import read_vllm_bench, write_runs
from toolkit.report import write_report

ROOT = Path(__file__).resolve().parents[2]
REAL = BUNDLED / "real_runs" / "rtx4090_llama31_8b_vllm"
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
PD_RUN = SimConfig(
    workload="cc", agents=20, duration_s=400.0, warmup_s=100.0, nodes=4, split="3P1D",
    telemetry="full", window_s=100.0, cooldown_s=30.0, l1_tokens=200_000, l2_tokens=400_000,
)  # fmt: skip


def _save(shot: bytes, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / name).write_bytes(shot)
    extra = os.environ.get("PDLAB_ARTIFACTS")
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        (Path(extra) / name).write_bytes(shot)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), f"{CHROMIUM} missing: apt-get install chromium (see .ci/run)"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def _open(browser, url: str, plots: int):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(60_000)
    page.goto(url)
    page.wait_for_function(
        f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {plots}"
    )
    page.wait_for_timeout(500)  # the last relayout
    return page


@pytest.mark.browser
def test_report_of_a_request_only_run(browser, tmp_path: Path) -> None:
    db = tmp_path / "real.duckdb"
    write_runs(db, [read_vllm_bench(REAL, run_id="rtx4090-llama31-8b")])
    report = write_report(db, tmp_path / "real.html")
    assert list(report.titles) == ["latency", "queue"]
    page = _open(browser, (tmp_path / "real.html").as_uri(), 2)
    try:
        text = page.inner_text("body")
        assert "Not shown: pass timeline" in text and "figure failed" not in text
        assert "time per output token (TPOT)" in text
        assert "running (recorded)" in text and "waiting (from request times)" in text
        assert "no prefill iterations logged" not in text
        _save(page.screenshot(full_page=True), "report-request-only.png")
    finally:
        page.close()


@pytest.mark.browser
def test_report_of_a_pd_cluster_run_and_its_gantt(browser, tmp_path: Path) -> None:
    db = tmp_path / "pd.duckdb"
    simulate(PD_RUN, db)
    report = write_report(db, tmp_path / "pd.html")
    assert not report.failures and report.absent is None
    assert {"split", "timeline", "planner", "phi"} <= set(report.titles)
    page = _open(browser, (tmp_path / "pd.html").as_uri(), len(report.titles))
    try:
        _save(page.screenshot(full_page=True), "report-pd-cluster.png")
        gantt = page.locator("#timeline")
        gantt.scroll_into_view_if_needed()
        _save(gantt.screenshot(), "gantt.png")
        # Hover the pass widest on screen: plotly's hover label names its requests.
        area = page.locator('#timeline .nsewdrag[data-subplot="x2y2"]').bounding_box()
        assert area is not None
        paths = page.locator("#timeline .barlayer .point path")
        boxes = [b for b in (paths.nth(i).bounding_box() for i in range(paths.count())) if b]
        assert boxes, "no pass bars drawn"

        def shown(b: dict) -> tuple[float, float]:  # (visible width, its middle)
            lo, hi = max(b["x"], area["x"]), min(b["x"] + b["width"], area["x"] + area["width"])
            return hi - lo, (lo + hi) / 2

        widest = max(boxes, key=lambda b: shown(b)[0])
        page.mouse.move(shown(widest)[1], widest["y"] + widest["height"] / 2)
        label = page.locator("#timeline .hoverlayer .hovertext")
        label.first.wait_for()
        said = label.first.text_content() or ""
        assert "pass" in said and "ms" in said and "cc-" in said, said  # a request id
        _save(gantt.screenshot(), "gantt-hover.png")
    finally:
        page.close()


@pytest.mark.browser
@pytest.mark.slow
def test_notebook_05_multi_seed_figure(browser, tmp_path: Path, monkeypatch) -> None:
    name = "05_compare_policies.ipynb"
    shutil.copy(ROOT / "notebooks" / name, tmp_path / name)
    monkeypatch.setenv("PDLAB_QUICK", "1")
    for var in ("PDLAB_URL", "PDLAB_TOKEN", "PDLAB_DB"):
        monkeypatch.delenv(var, raising=False)
    nb = nbformat.read(tmp_path / name, as_version=4)
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    figs = [
        o["data"]["application/vnd.plotly.v1+json"]
        for c in nb.cells
        for o in c.get("outputs", [])
        if "application/vnd.plotly.v1+json" in o.get("data", {})
    ]
    seeds = next(f for f in figs if "over seeds" in f["layout"]["title"]["text"])
    html = tmp_path / "nb05.html"
    html.write_text(
        "<html><head><meta charset='utf-8'><script>"
        + get_plotlyjs().replace("</script", "<\\/script")
        + "</script></head><body><div id='f'></div><script>"
        + f"const f = {json.dumps(seeds)}; Plotly.newPlot('f', f.data, f.layout);"
        + "</script></body></html>",
        encoding="utf-8",
    )
    page = _open(browser, html.as_uri(), 1)
    try:
        text = page.inner_text("#f")
        assert "paired by seed" in text and "static planner" in text
        _save(page.locator("#f").screenshot(), "nb05-seeds.png")
    finally:
        page.close()


@pytest.mark.browser
def test_the_lag_badge_glyph_is_one_chromium_draws(browser) -> None:
    from toolkit.client import PdlabClient
    from toolkit.widgets import ClusterDashboard

    dash = ClusterDashboard(client=PdlabClient("http://127.0.0.1:9", "x"), timeline=False)
    dash._draw_health({"lag_s": 120.0, "speed": 20.0})
    page = browser.new_page(viewport={"width": 900, "height": 120})
    try:
        page.set_content(f"<body style='font-family: sans-serif'>{dash.lag_badge.value}</body>")
        assert "⚠ lag: 120 simulated s behind" in page.inner_text("body")
        _save(page.locator("span").screenshot(), "lag-badge.png")
    finally:
        page.close()
