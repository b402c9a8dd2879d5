"""`pdlab dashboards`: the dashboard names only served metrics, provisioning files parse as
Grafana and Prometheus read them, and bad input is a one-line error (no Prometheus needed;
tests/toolkit/test_dashboards_prometheus.py runs the queries against a real one)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from typer.testing import CliRunner

from cluster.server.metric_catalog import CATALOG
from toolkit.cli import app
from toolkit.grafana import DATASOURCE_UID, dashboard, panel_queries

SERVED = {m.name for m in CATALOG} | {
    f"{m.name}{suffix}" for m in CATALOG if m.kind == "histogram" for suffix in ("_bucket",)
}


def test_every_query_names_served_metrics_and_panels_do_not_overlap() -> None:
    board = dashboard()
    named = {
        name for _, expr in panel_queries(board) for name in re.findall(r"pdlab_[a-z0-9_]+", expr)
    }
    assert named and named <= SERVED, named - SERVED
    # Every histogram is drawn, and no legacy name is used.
    histograms = {m.name for m in CATALOG if m.kind == "histogram"}
    assert {n.removesuffix("_bucket") for n in named} >= histograms
    assert not named & {m.name for m in CATALOG if m.legacy}
    panels = board["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells = set()
    for p in panels:
        g = p["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, p["title"]
                cells.add((x, y))
        assert g["x"] + g["w"] <= 24


def test_provisioning_files(tmp_path: Path) -> None:
    out = tmp_path / "monitoring"
    res = CliRunner().invoke(app, ["dashboards", "grafana", "--out", str(out),
                                   "--prometheus-url", "http://127.0.0.1:9999",
                                   "--pdlab-url", "http://127.0.0.1:8600",
                                   "--pdlab-url", "127.0.0.1:8601"])  # fmt: skip
    assert res.exit_code == 0, res.output
    ds = yaml.safe_load((out / "provisioning/datasources/pdlab.yaml").read_text())
    assert ds["datasources"][0] | {"jsonData": None} == {
        "name": "pdlab Prometheus", "uid": DATASOURCE_UID, "type": "prometheus",
        "access": "proxy", "url": "http://127.0.0.1:9999", "isDefault": True, "jsonData": None,
    }  # fmt: skip
    provider = yaml.safe_load((out / "provisioning/dashboards/pdlab.yaml").read_text())
    board_dir = Path(provider["providers"][0]["options"]["path"])
    assert board_dir.is_absolute() and (board_dir / "pdlab-cluster.json").is_file()
    prom = yaml.safe_load((out / "prometheus.yml").read_text())
    job = prom["scrape_configs"][0]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == ["127.0.0.1:8600", "127.0.0.1:8601"]
    assert prom["global"]["scrape_interval"] == "5s"


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, closed_port: int) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["dashboards", "grafana", "--out", str(tmp_path),
                              "--pdlab-url", "ftp://host"])  # fmt: skip
    assert res.exit_code == 2 and "--pdlab-url must be http://HOST:PORT" in res.output
    a_file = tmp_path / "f"
    a_file.write_text("x")
    res = runner.invoke(app, ["dashboards", "grafana", "--out", str(a_file)])
    assert res.exit_code == 2 and "is not a directory" in res.output
    res = runner.invoke(app, ["dashboards", "grafana", "--out", str(tmp_path),
                              "--scrape-interval", "0"])  # fmt: skip
    assert res.exit_code == 2 and "--scrape-interval must be in" in res.output
    # No Prometheus there: every query fails, named, and the check exits 1.
    res = runner.invoke(app, ["dashboards", "check", "--json",
                              "--prometheus-url", f"http://127.0.0.1:{closed_port}"])  # fmt: skip
    assert res.exit_code == 1 and "queries returned no data" in res.output
    assert "ConnectError" in res.output
