"""A real Prometheus scrapes a live `pdlab serve`; every Grafana panel query returns data.

Debian's `prometheus` binary (installed by .ci/run) runs on a free loopback port with the
scrape config `pdlab dashboards grafana` writes, pointed at a `pdlab serve` subprocess (a
4-node simulated cluster at 50x; the gain planner advising every 20 simulated seconds, one
node switched by hand). After a few one-second scrapes, every query of every panel of every
dashboard under dashboards/ runs against Prometheus' HTTP API, with the dashboards'
variables filled in as Grafana would, and must return a number. The committed dashboard is
the one `toolkit.grafana` builds.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from toolkit.cli import app
from toolkit.client import ServerProcess, free_port, launch_server
from toolkit.grafana import check_queries, dashboard_text, panel_queries

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "dashboards").glob("*.json"))
PROMETHEUS = shutil.which("prometheus")
TOKEN = "dash-token"


def test_the_committed_dashboard_is_the_generated_one() -> None:
    assert [p.name for p in DASHBOARDS] == ["pdlab-cluster.json"]
    assert DASHBOARDS[0].read_text() == dashboard_text(), (
        "regenerate: python -m toolkit.grafana > dashboards/pdlab-cluster.json"
    )
    board = json.loads(DASHBOARDS[0].read_text())
    queries = panel_queries(board)
    assert len(queries) >= 30 and all("$" not in q for _, q in queries)


@pytest.fixture(scope="module")
def pdlab_serve() -> Iterator[ServerProcess]:
    srv = launch_server(
        "--nodes", "4", "--split", "2P2D", "--agents", "24", "--window", "20", "--slices", "4",
        "--planner-mode", "advise", token=TOKEN, speed=50.0,
    )  # fmt: skip
    try:
        r = httpx.post(f"{srv.url}/v1/nodes/1/phase", json={"phase": "decode"},
                       headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)  # fmt: skip
        assert r.status_code == 200, r.text
        yield srv
    finally:
        assert srv.stop() == 0, srv.log()[-3000:]


@pytest.fixture(scope="module")
def prometheus(
    pdlab_serve: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    if PROMETHEUS is None:
        pytest.skip(
            "Debian's prometheus binary is absent (apt-get install prometheus; .ci/run does)"
        )
    out = tmp_path_factory.mktemp("grafana")
    res = CliRunner().invoke(app, ["dashboards", "grafana", "--out", str(out),
                                   "--pdlab-url", pdlab_serve.url, "--scrape-interval", "1"])  # fmt: skip
    assert res.exit_code == 0, res.output
    port = free_port()
    log = (out / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={out / 'prometheus.yml'}",
         f"--storage.tsdb.path={out / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (out / "prometheus.log").read_text()[-3000:]
            try:
                if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "Prometheus did not become ready in 30 s"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


def test_every_panel_query_returns_data_from_a_real_prometheus(prometheus: str) -> None:
    boards = [json.loads(p.read_text()) for p in DASHBOARDS]
    deadline = time.monotonic() + 45
    while True:
        # $__rate_interval: 10 s spans ten 1-second scrapes (Grafana's floor is 4).
        checks = [c for b in boards for c in check_queries(prometheus, b, rate_interval="10s")]
        missing = [c for c in checks if not c.has_data]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(2)
    up = httpx.get(f"{prometheus}/api/v1/query", params={"query": 'up{job="pdlab"}'}).json()
    assert [r["value"][1] for r in up["data"]["result"]] == ["1"], up
    assert not missing, "\n".join(f"{c.panel}: {c.expr} -> {c.error or 'no data'}" for c in missing)
    assert len(checks) >= 30
