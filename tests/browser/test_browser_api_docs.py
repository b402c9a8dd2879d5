"""Real browser, offline: `/docs` (Swagger UI) of the control server renders every endpoint
with no request leaving the loopback server.

Headless Chromium (Debian's /usr/bin/chromium through Playwright) opens the pages of an
in-process control server over a small paced simulation; every request the
pages make is routed through a handler that lets loopback URLs through and aborts (and
records) any other, so a page that needed a CDN would render nothing and fail here.
"""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from cluster.server import ControlService, create_app
from cluster.sglang.live.serving import ServerThread
from cluster.sim.paced import PacedSimulation
from cluster.sim.simulator import SimConfig

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip


@pytest.fixture
def server_url() -> Iterator[str]:
    cfg = SimConfig(workload="cc", nodes=2, split="1P1D", agents=2, warmup_s=0.0)
    with ServerThread(create_app(ControlService(PacedSimulation(cfg)), "docs-token")) as server:
        yield server.url


@pytest.mark.browser
def test_api_docs_render_offline(server_url: str) -> None:
    from playwright.sync_api import Route, sync_playwright

    outside: list[str] = []

    def only_loopback(route: Route) -> None:
        if urlsplit(route.request.url).hostname in ("127.0.0.1", "localhost"):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page()
            page.route("**/*", only_loopback)
            page.goto(f"{server_url}/docs")
            # Swagger UI drew one block per operation from /openapi.json.
            page.wait_for_selector(".opblock", timeout=30_000)
            paths = page.locator(".opblock-summary-path").all_inner_texts()
            assert "/v1/planner/apply" in {t.replace("\u200b", "") for t in paths}
            schema = httpx.get(f"{server_url}/openapi.json", timeout=10).json()
            operations = sum(len(ops) for ops in schema["paths"].values())
            assert page.locator(".opblock").count() == operations
            assert "pdlab control server" in page.title()
        finally:
            browser.close()
    assert outside == []
