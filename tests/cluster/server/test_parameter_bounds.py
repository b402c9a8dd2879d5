"""Every REST parameter is bounded: out-of-range values are 422 naming the allowed range.

Against a real `pdlab serve` on loopback (conftest). `PUT /v1/planner {"slices": 10**12}`
used to be accepted, and the next planner evaluation then held the control-plane lock for
good: here it is refused and the server keeps answering at once.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from telemetry import open_reader
from toolkit.client import ServerProcess, launch_server

OUT_OF_RANGE: list[tuple[str, str, Any, str]] = [
    # (method, path, JSON body or None, what the message must contain)
    ("PUT", "/v1/planner", {"slices": 10**12}, "slices: Input should be less than or equal to 100; allowed: [2, 100] slices (got 1000000000000)"),
    ("PUT", "/v1/planner", {"slices": 1}, "allowed: [2, 100] slices"),
    ("PUT", "/v1/planner", {"slices": 2.5}, "slices: Input should be a valid integer"),
    ("PUT", "/v1/planner", {"slices": "many"}, "allowed: [2, 100] slices (got 'many')"),
    ("PUT", "/v1/planner", {"window_s": 1e12}, "window_s: Input should be less than or equal to 86400; allowed: [10, 86400] simulated s"),
    ("PUT", "/v1/planner", {"window_s": 9.5}, "allowed: [10, 86400] simulated s (got 9.5)"),
    ("PUT", "/v1/planner", {"window_s": 60, "slices": 100}, "window_s / slices must be >= 1 s"),
    ("PUT", "/v1/router", {"copy_price": 1e308}, "copy_price: Input should be less than or equal to 0.01; allowed: [0, 0.01] s/token (got 1e+308)"),
    ("PUT", "/v1/router", {"copy_price": -1e-9}, "allowed: [0, 0.01] s/token"),
    ("PUT", "/v1/router", {"policy": ""}, "policy: String should have at least 1 character"),
    ("PUT", "/v1/router", {"policy": "p" * 65}, "policy: String should have at most 64 characters"),
    ("POST", "/v1/nodes/-1/phase", {"phase": "decode"}, "path.node_id: Input should be greater than or equal to 0; allowed: [0, 2147483647]"),
    ("POST", f"/v1/nodes/{2**31}/phase", {"phase": "decode"}, "allowed: [0, 2147483647] (got '2147483648')"),
    ("POST", f"/v1/nodes/{10**40}/phase", {"phase": "decode"}, "path.node_id"),
    ("GET", "/v1/timeline?since=-1", None, "query.since: Input should be greater than or equal to 0; allowed: [0, 1000000000] s"),
    ("GET", "/v1/timeline?since=1e300", None, "allowed: [0, 1000000000] s"),
    ("GET", "/v1/timeline?since=nan", None, "query.since: Input should be a finite number"),
    ("GET", "/v1/timeline?since=inf", None, "query.since: Input should be a finite number"),
    ("GET", "/v1/branches?limit=-1", None, "allowed: [0, 10000] branch ids"),
    ("GET", f"/v1/branches?limit={10**30}", None, "query.limit"),
    ("GET", "/v1/branches/" + "b" * 257, None, "path.branch_id: String should have at most 256 characters"),
]  # fmt: skip


@pytest.mark.parametrize(("method", "path", "body", "needle"), OUT_OF_RANGE)
def test_out_of_range_values_are_422_naming_the_allowed_range(
    http: httpx.Client, auth: dict[str, str], method: str, path: str, body: Any, needle: str
) -> None:
    r = http.request(method, path, json=body, headers=auth)
    assert r.status_code == 422, r.text
    assert needle in r.json()["detail"], r.text


def test_non_finite_json_numbers_are_refused(http: httpx.Client, auth: dict[str, str]) -> None:
    headers = {**auth, "Content-Type": "application/json"}
    for raw in (b'{"window_s": NaN}', b'{"window_s": Infinity}', b'{"copy_price": -Infinity}'):
        r = http.put("/v1/planner" if b"window" in raw else "/v1/router", content=raw,
                     headers=headers)  # fmt: skip
        assert r.status_code == 422 and "Input should be a finite number" in r.json()["detail"]


def test_refused_values_change_nothing_and_the_server_keeps_answering(
    server: ServerProcess, auth: dict[str, str]
) -> None:
    # A short timeout: a server stuck in a slice loop holding the lock fails here.
    with httpx.Client(base_url=server.url, timeout=3.0) as http:
        before = http.get("/v1/planner").json()
        r = http.put("/v1/planner", json={"slices": 10**12, "mode": "auto"}, headers=auth)
        assert r.status_code == 422
        assert http.put("/v1/router", json={"copy_price": 1e308}, headers=auth).status_code == 422
        t0 = http.get("/v1/health").json()["time"]
        time.sleep(1.5)  # a few planner evaluations (60 s windows at 40x)
        after = http.get("/v1/planner").json()
        assert (after["mode"], after["slices"], after["window_s"]) == (
            before["mode"], before["slices"], before["window_s"],
        )  # fmt: skip
        health = http.get("/v1/health").json()
        assert health["status"] == "ok" and health["time"] > t0 + 20


def test_values_at_the_bounds_are_accepted(http: httpx.Client, auth: dict[str, str]) -> None:
    before = http.get("/v1/planner").json()
    r = http.put("/v1/planner", json={"window_s": 100, "slices": 100}, headers=auth)
    assert r.status_code == 200 and (r.json()["window_s"], r.json()["slices"]) == (100, 100)
    r = http.put("/v1/planner", json={"window_s": 86_400, "slices": 2}, headers=auth)
    assert r.status_code == 200
    r = http.put("/v1/planner", json={"window_s": before["window_s"], "slices": before["slices"]},
                 headers=auth)  # fmt: skip
    assert r.status_code == 200
    router = http.get("/v1/router").json()
    for price in (0.01, 0.0, router["copy_price"]):
        r = http.put("/v1/router", json={"copy_price": price}, headers=auth)
        assert r.status_code == 200 and r.json()["copy_price"] == price
    assert http.get("/v1/timeline?since=1000000000").json()["samples"]["t"] == []
    assert http.get("/v1/branches?limit=10000").status_code == 200
    assert http.get("/v1/branches?limit=0").json()["branch_ids"] == []


def test_sigterm_stops_the_server_after_refused_values(tmp_path: Path) -> None:
    db = tmp_path / "term.duckdb"
    srv = launch_server("--nodes", "2", "--split", "1P1D", "--agents", "8", "--window", "60",
                        "--slices", "4", token="t", db=db, speed=40.0)  # fmt: skip
    try:
        with httpx.Client(base_url=srv.url, timeout=3.0) as http:
            auth = {"Authorization": "Bearer t"}
            assert http.put("/v1/planner", json={"slices": 10**12}, headers=auth).status_code == 422
            time.sleep(2.0)  # past the next planner evaluations
            assert http.get("/v1/health").json()["status"] == "ok"
        srv.proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal it caught.
        assert srv.proc.wait(30) in (0, -signal.SIGTERM), srv.log()[-2000:]
    finally:
        srv.stop(5)
    runs = open_reader(db).runs()  # the shutdown closed the run: consolidated, not live
    assert runs.height == 1 and not runs["live"][0]
