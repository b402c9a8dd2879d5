"""Real browser: `pdlab attach` over a torch cluster started separately, its dashboard in Chromium.

The fleet is `pdlab serve --engines torch` (three torch engine processes, 1P2D, cc agents
through its own PD proxy; planner in advise mode): started on its own, it neither knows nor
needs pdlab attach. `pdlab attach --engine URL ...` (a second process) discovers the three
engines and watches them in shadow mode; JupyterLab opens a two-cell notebook showing
`ClusterDashboard` over attach's REST API, and headless Chromium (Debian's /usr/bin/chromium
via Playwright) runs it. The page shows the shadow line (the router's pick with its
predicted TTFT, the planner's evaluation), the node cards, and no switch happens: neither
attach nor the fleet records one. Ctrl-C of attach closes its run with iteration rows,
KV events and /metrics samples. Screenshot: tests/browser/artifacts/dashboard-attach.png.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from test_browser_dashboard import (
    CHROMIUM,
    CHROMIUM_ARGS,
    LAB_SETTINGS,
    _save,
    wait_until,
)

from telemetry import open_reader
from toolkit.client import PdlabApiError, PdlabClient, free_port, launch_server

FLEET = ["--engines", "torch", "--nodes", "3", "--split", "1P2D", "--agents", "4",
         "--workload", "cc"]  # fmt: skip
NOTEBOOK = {
    "cells": [
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
         "source": ["import os\n", "from toolkit.widgets import ClusterDashboard\n",
                    "dash = ClusterDashboard(os.environ['PDLAB_URL'], os.environ['PDLAB_TOKEN'],"
                    " refresh_s=1.0)\n", "dash.display()\n"]},
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
         "source": ["print('attach dashboard shown')\n"]},
    ],
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                "language": "python"}},
    "nbformat": 4, "nbformat_minor": 5,
}  # fmt: skip


def _spawn(args: list[str], log: Path, env: dict[str, str], cwd: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=cwd)  # fmt: skip


def _stop(proc: subprocess.Popen[bytes], sig: int) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


@pytest.mark.slow
@pytest.mark.browser
def test_attach_dashboard_in_chromium_over_a_separate_torch_cluster(tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), f"{CHROMIUM} missing: apt-get install chromium"
    fleet = launch_server(*FLEET, db=tmp_path / "fleet.duckdb", timeout_s=300)
    attach = lab = None
    try:
        fleet_client = fleet.client(timeout_s=30)
        urls = [n["url"] for n in fleet_client.cluster()["nodes"]]
        port = free_port()
        token, lab_token = "attach-token", "lab-token"
        db = tmp_path / "attach.duckdb"
        env = {**os.environ, "PDLAB_URL": f"http://127.0.0.1:{port}", "PDLAB_TOKEN": token}
        args = [
            sys.executable,
            "-m",
            "toolkit.cli",
            "attach",
            "--router",
            fleet.url,
            "--db",
            str(db),
            "--port",
            str(port),
            "--token",
            token,
            "--run-id",
            "attach",
        ]
        for u in urls:
            args += ["--engine", u]  # fmt: skip
        attach_log = tmp_path / "attach.log"
        attach = _spawn(args, attach_log, env, tmp_path)
        wait_until(lambda: attach.poll() is not None or "pdlab attach:" in attach_log.read_text(),
                   120, "pdlab attach to serve")  # fmt: skip
        assert attach.poll() is None, attach_log.read_text()[-3000:]
        client = PdlabClient(env["PDLAB_URL"], token)

        def attach_up() -> bool:
            try:
                return client.health()["status"] == "ok"
            except PdlabApiError:
                return False

        wait_until(attach_up, 60, "pdlab attach's REST API")
        client.set_planner(window_s=10, slices=2)  # an evaluation within 10 s
        nbdir = tmp_path / "nb"
        nbdir.mkdir()
        (nbdir / "attach.ipynb").write_text(json.dumps(NOTEBOOK))
        settings = tmp_path / "lab-settings"
        for name, value in LAB_SETTINGS.items():
            plugin, file = name.rsplit("/", 1)
            (settings / plugin).mkdir(parents=True, exist_ok=True)
            (settings / plugin / file).write_text(json.dumps(value))
        # The widget extensions live beside jupyterlab's install (a venv layered on another
        # venv's site-packages, as here, does not list that prefix among its data paths).
        import jupyterlab

        shared = Path(jupyterlab.__file__).resolve().parents[4] / "share" / "jupyter"
        lab_env = env | {"JUPYTERLAB_SETTINGS_DIR": str(settings),
                         "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
                         "JUPYTER_PATH": os.pathsep.join(
                             p for p in (str(shared), os.environ.get("JUPYTER_PATH")) if p)}  # fmt: skip
        for _attempt in range(3):  # another process may take the free port first
            lab_port = free_port()
            lab_url = f"http://127.0.0.1:{lab_port}"
            lab = _spawn(
                [sys.executable, "-m", "jupyterlab", "--ServerApp.ip=127.0.0.1",
                 f"--ServerApp.port={lab_port}", "--ServerApp.port_retries=0",
                 f"--IdentityProvider.token={lab_token}", f"--ServerApp.root_dir={nbdir}",
                 "--ServerApp.open_browser=False",
                 *(["--allow-root"] if os.geteuid() == 0 else [])],
                tmp_path / "lab.log", lab_env, tmp_path,
            )  # fmt: skip

            def lab_up(proc: subprocess.Popen[bytes] = lab, url: str = lab_url) -> bool:
                if proc.poll() is not None:
                    return True
                try:
                    return httpx.get(f"{url}/api", timeout=2).status_code == 200
                except httpx.TransportError:
                    return False

            wait_until(lab_up, 120, "JupyterLab")
            if lab.poll() is None:
                break
        assert lab.poll() is None, (tmp_path / "lab.log").read_text()[-2000:]

        def kernel_idle() -> bool:
            r = httpx.get(f"{lab_url}/api/kernels", params={"token": lab_token}, timeout=5)
            return r.status_code == 200 and any(k["execution_state"] == "idle" for k in r.json())

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1500, "height": 1100})
                page.set_default_timeout(60_000)
                page.goto(f"{lab_url}/lab/tree/attach.ipynb?token={lab_token}")
                page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for()
                wait_until(kernel_idle, 120, "the notebook's kernel to start")
                page.locator("#jp-MainMenu .lm-MenuBar-itemLabel", has_text="Run").first.click()
                page.get_by_text("Run All Cells", exact=True).click()
                page.locator(".jp-OutputArea-output", has_text="attach dashboard shown").wait_for(
                    timeout=180_000
                )
                shadow = page.locator(".pdlab-shadow")
                try:
                    shadow.get_by_text("shadow mode").wait_for(timeout=60_000)
                except Exception:
                    _save(page.screenshot(full_page=True), "attach-failed.png")
                    raise
                # The router's pick (traffic observed) and the planner's evaluation.
                shadow.get_by_text("→ node 0").wait_for(timeout=180_000)
                shadow.get_by_text("t=").wait_for(timeout=120_000)
                text = shadow.inner_text()
                assert "predicted TTFT" in text and ("keep 1P2D" in text or "recommend" in text)
                assert page.locator(".pdlab-node-card").count() == 3
                dashboard = page.locator(".pdlab-dashboard")
                dashboard.evaluate("el => el.scrollIntoView()")
                box = dashboard.bounding_box()
                assert box is not None
                _save(page.screenshot(clip=box), "dashboard-attach.png")
            finally:
                browser.close()
        state = client.cluster()
        assert state["switches"] == 0 and state["mode"] == "shadow"
        assert fleet_client.cluster()["switches"] == 0  # nothing switched the fleet either
    finally:
        if lab is not None:
            _stop(lab, signal.SIGTERM)
        if attach is not None:
            assert _stop(attach, signal.SIGINT) == 0, attach_log.read_text()[-3000:]
        fleet.stop()
    r = open_reader(db)
    assert r.runs()["source"].to_list() == ["attach"] and not r.runs()["live"][0]
    assert r.table("prefill_iterations", run_id="attach").height > 0
    assert r.table("kv_events", run_id="attach").height > 0
    assert r.table("engine_metrics", run_id="attach").height > 0
    assert r.table("phase_switches", run_id="attach").height == 0
