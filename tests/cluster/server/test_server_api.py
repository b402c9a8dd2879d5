"""The REST API of `pdlab serve` (SPEC §6) over real HTTP on loopback, against a paced simulation.

The server runs in its own process (cc workload, 4 nodes 2P2D, 40x); tests read its state
through the API and its telemetry through `telemetry.open_reader` while it writes the run.
Tests that change the cluster pick their target from the state they read, so their order
does not matter.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from telemetry import open_reader
from toolkit.client import ServerProcess

NODE_KEYS = {"id", "phase", "queue", "running", "kv_gpu_used", "kv_host_used", "switching"}


def wait_until(pred: Callable[[], Any], timeout_s: float = 30.0, what: str = "it") -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = pred()
        if (got is not None) if not isinstance(got, bool | int) else got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.2)


def cluster(http: httpx.Client) -> dict[str, Any]:
    r = http.get("/v1/cluster")
    assert r.status_code == 200, r.text
    return r.json()


def settled(http: httpx.Client) -> dict[str, Any]:
    """The cluster once no switch is pending (switches drain running requests first)."""

    def calm() -> dict[str, Any] | None:
        s = cluster(http)
        return s if all(n["switching"] is None for n in s["nodes"]) else None

    return wait_until(calm, what="pending switches to complete")


def test_health_and_cluster_state_advance_with_wall_time(http: httpx.Client) -> None:
    h = http.get("/v1/health").json()
    assert h["status"] == "ok" and h["run_id"].startswith("run-") and h["speed"] == 40.0
    assert h["lag_s"] >= 0.0 and h["db"].endswith("live.duckdb") and not h["finished"]
    first = cluster(http)
    assert first["split"]["prefill"] + first["split"]["decode"] == 4
    assert [n["id"] for n in first["nodes"]] == [0, 1, 2, 3]
    for n in first["nodes"]:
        assert set(n) >= NODE_KEYS
        assert n["phase"] in ("prefill", "decode")
        assert n["kv_gpu_used"] >= 0 and 0 <= n["kv_host_used"] <= n["kv_host_capacity"]
    time.sleep(0.5)
    second = cluster(http)
    # 40 simulated seconds per wall second: half a second moves the clock ~20 s.
    assert second["time"] - first["time"] > 5.0
    later = wait_until(
        lambda: (s := cluster(http))["requests_completed"] > 0 and s, what="requests"
    )
    assert later["latency"]["ttft_p50_s"] is not None and later["latency"]["ttft_p50_s"] > 0


def test_mutations_without_valid_token_are_401_and_change_nothing(
    http: httpx.Client, auth: dict[str, str]
) -> None:
    before = cluster(http)
    calls = [
        ("POST", "/v1/nodes/0/phase", {"phase": "decode"}),
        ("PUT", "/v1/planner", {"mode": "off"}),
        ("POST", "/v1/planner/apply", None),
        ("PUT", "/v1/router", {"policy": "round-robin"}),
    ]
    for method, path, body in calls:
        r = http.request(method, path, json=body)
        assert r.status_code == 401, (path, r.text)
        assert "missing bearer token" in r.json()["detail"]
        assert r.headers["www-authenticate"] == "Bearer"
        r = http.request(method, path, json=body, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and r.json()["detail"] == "invalid bearer token"
    # A bad body without a token is refused for the token first: nothing is revealed.
    r = http.post("/v1/nodes/0/phase", json={"phase": "sideways"})
    assert r.status_code == 401
    after = cluster(http)
    assert [n["phase"] for n in after["nodes"]] == [n["phase"] for n in before["nodes"]]
    assert after["router"]["policy"] == before["router"]["policy"]
    assert http.get("/v1/planner").json()["mode"] == "advise"


def test_invalid_phase_or_node_gets_4xx_with_a_clear_message(
    http: httpx.Client, auth: dict[str, str]
) -> None:
    r = http.post("/v1/nodes/0/phase", json={"phase": "sideways"}, headers=auth)
    assert r.status_code == 422
    assert r.json()["detail"] == (
        "invalid request: phase: Input should be 'prefill' or 'decode' (got 'sideways')"
    )
    r = http.post("/v1/nodes/99/phase", json={"phase": "decode"}, headers=auth)
    assert r.status_code == 404
    assert r.json()["detail"] == "unknown node 99; nodes are [0, 1, 2, 3]"
    r = http.post("/v1/nodes/abc/phase", json={"phase": "decode"}, headers=auth)
    assert (
        r.status_code == 422 and "node_id" in r.json()["detail"] and "'abc'" in r.json()["detail"]
    )
    r = http.post("/v1/nodes/0/phase", json={}, headers=auth)
    assert r.status_code == 422 and "phase: Field required" in r.json()["detail"]
    r = http.post("/v1/nodes/0/phase", json={"phase": "decode", "force": True}, headers=auth)
    assert r.status_code == 422 and "force: Extra inputs are not permitted" in r.json()["detail"]
    s = cluster(http)
    same = next(n for n in s["nodes"] if n["switching"] is None)
    r = http.post(f"/v1/nodes/{same['id']}/phase", json={"phase": same["phase"]}, headers=auth)
    assert r.status_code == 409
    assert r.json()["detail"] == f"node {same['id']} already serves {same['phase']}"


def test_concurrent_switches_of_one_node_are_serialized(
    http: httpx.Client, auth: dict[str, str], server: ServerProcess
) -> None:
    s = settled(http)
    decode = [n for n in s["nodes"] if n["phase"] == "decode"]
    assert len(decode) >= 2, s
    # The busiest decode node drains longest, so the second request finds it switching.
    node = max(decode, key=lambda n: n["running"])["id"]
    barrier = threading.Barrier(2)
    answers: list[httpx.Response] = []

    def post() -> None:
        with httpx.Client(base_url=server.url, timeout=15.0) as c:
            barrier.wait()
            answers.append(
                c.post(f"/v1/nodes/{node}/phase", json={"phase": "prefill"}, headers=auth)
            )

    threads = [threading.Thread(target=post) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    codes = sorted(a.status_code for a in answers)
    assert codes == [200, 409], [a.text for a in answers]
    ok = next(a.json() for a in answers if a.status_code == 200)
    refused = next(a.json()["detail"] for a in answers if a.status_code == 409)
    assert ok["trigger"] == "manual" and ok["from_phase"] == "decode"
    assert ok["to_phase"] == "prefill" and ok["status"] in ("switching", "done")
    # Either the first switch is still draining or it already completed.
    assert refused.startswith(
        (
            f"node {node} is already switching decode -> prefill",
            f"node {node} already serves prefill",
        )
    ), refused

    # The switch completes, and the telemetry a notebook reads shows it with trigger 'manual'.
    wait_until(
        lambda: next(n for n in cluster(http)["nodes"] if n["id"] == node)["phase"] == "prefill",
        what=f"node {node} to serve prefill",
    )
    reader = open_reader(Path(server.db or ""))

    def switch_rows() -> Any:
        df = reader.sql(
            "SELECT * FROM phase_switches WHERE node_id = ? AND to_phase = 'prefill'", [node]
        )
        return None if df.is_empty() else df

    rows = wait_until(switch_rows, what="the phase_switches row")
    assert rows.height == 1
    row = rows.row(0, named=True)
    assert row["trigger"] == "manual" and row["from_phase"] == "decode"
    assert row["t_decided"] == pytest.approx(ok["t_decided"]) and row["t_done"] >= row["t_decided"]


def test_router_get_and_put_validate(http: httpx.Client, auth: dict[str, str]) -> None:
    r = http.get("/v1/router").json()
    assert r["policy"] == "ttft" and "round-robin" in r["policies"]
    r = http.put("/v1/router", json={"policy": "nope"}, headers=auth)
    assert r.status_code == 422
    assert r.json()["detail"] == (
        "unknown router policy 'nope'; choose one of: "
        "cache-aware, dynamo, least-loaded, round-robin, sticky, ttft"
    )
    r = http.put("/v1/router", json={"copy_price": -1}, headers=auth)
    assert r.status_code == 422 and "copy_price" in r.json()["detail"]
    r = http.put("/v1/router", json={"policy": "least-loaded", "copy_price": 5e-7}, headers=auth)
    assert r.status_code == 200
    assert r.json()["policy"] == "least-loaded" and r.json()["copy_price"] == 5e-7
    got = http.get("/v1/router").json()
    assert got["policy"] == "least-loaded" and got["copy_price"] == 5e-7
    r = http.put("/v1/router", json={"policy": "ttft"}, headers=auth)
    assert r.json()["policy"] == "ttft" and r.json()["copy_price"] == 5e-7  # price kept


def test_planner_put_validates_and_apply_starts_the_recommended_split(
    http: httpx.Client, auth: dict[str, str]
) -> None:
    for body, needle in (
        ({"mode": "sometimes"}, "mode: Input should be 'auto', 'advise' or 'off'"),
        (
            {"window_s": 0},
            "window_s: Input should be greater than or equal to 10; allowed: [10, 86400]",
        ),
        ({"slices": 1}, "slices: Input should be greater than or equal to 2"),
    ):
        r = http.put("/v1/planner", json=body, headers=auth)
        assert r.status_code == 422 and needle in r.json()["detail"], r.text
    r = http.put("/v1/planner", json={"mode": "off", "window_s": 40, "slices": 4}, headers=auth)
    assert r.status_code == 200
    p = http.get("/v1/planner").json()
    assert (p["mode"], p["window_s"], p["slices"], p["name"]) == ("off", 40.0, 4, "gain")
    assert http.put("/v1/planner", json={"mode": "advise"}, headers=auth).json()["mode"] == "advise"

    # cc on 2P2D: the gain test recommends 1P (decode-bound) once a window has data.
    settled(http)
    s = cluster(http)
    r = http.post("/v1/planner/apply", headers=auth)
    if r.status_code == 409:  # a split without a qualified candidate is a clear refusal
        assert "no candidate split qualified" in r.json()["detail"], r.text
        return
    assert r.status_code == 200, r.text
    out = r.json()
    d = out["decision"]
    assert d["chosen_prefill"] != d["current_prefill"] == s["split"]["prefill"]
    assert {c["prefill_count"] for c in d["candidates"]} == set(range(1, 4)) - {
        s["split"]["prefill"]
    }
    chosen = next(c for c in d["candidates"] if c["prefill_count"] == d["chosen_prefill"])
    assert chosen["qualified"] and chosen["mean_gain"] > 0
    assert out["started"] == [m["node"] for m in d["switches"]]
    nodes = {n["id"]: n for n in cluster(http)["nodes"]}
    for m in d["switches"]:
        n = nodes[m["node"]]
        assert n["phase"] == m["to_phase"] or n["switching"]["to_phase"] == m["to_phase"]
        if n["switching"]:
            assert n["switching"]["trigger"] == "manual"
    assert http.get("/v1/planner").json()["last_decision"]["t"] == d["t"]


def test_branches_and_directory(http: httpx.Client) -> None:
    listing = wait_until(
        lambda: (b := http.get("/v1/branches").json())["active"] and b, what="branches"
    )
    bid = listing["branch_ids"][-1]
    r = http.get(f"/v1/branches/{bid}")
    if r.status_code == 404:  # finished between the two calls
        return
    b = r.json()
    assert b["branch_id"] == bid and b["version"] >= 1 and b["path_blocks"] >= 0
    assert all(int(n) in range(4) and length >= 0 for n, length in b["counted"].items())
    r = http.get("/v1/branches/no-such-branch")
    assert r.status_code == 404 and "unknown branch 'no-such-branch'" in r.json()["detail"]
    d = http.get("/v1/directory/stats").json()
    assert d["blocks"] > 0 and d["holdings"] >= d["blocks"] and d["block_tokens"] == 256


def _samples(text: str, name: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def test_prometheus_metrics(http: httpx.Client) -> None:
    r = http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    split = _samples(text, "pdlab_split_nodes")
    s = cluster(http)
    assert (
        split['pdlab_split_nodes{phase="prefill"}'] + split['pdlab_split_nodes{phase="decode"}']
        == 4
    )
    queues = _samples(text, "pdlab_node_queue_requests")
    assert set(queues) == {f'pdlab_node_queue_requests{{node="{i}"}}' for i in range(4)}
    assert "# TYPE pdlab_requests_completed_total counter" in text
    done = _samples(text, "pdlab_requests_completed_total")["pdlab_requests_completed_total"]
    assert done > 0
    phases = _samples(text, "pdlab_node_phase")
    for n in s["nodes"]:
        if n["switching"] is None:
            assert phases[f'pdlab_node_phase{{node="{n["id"]}",phase="{n["phase"]}"}}'] == 1.0
    later = _samples(http.get("/metrics").text, "pdlab_requests_completed_total")
    assert later["pdlab_requests_completed_total"] >= done


def test_a_reader_in_this_process_sees_the_run_grow_while_it_is_written(
    server: ServerProcess,
) -> None:
    reader = open_reader(Path(server.db or ""))
    runs = reader.runs()
    assert runs.height == 1 and runs["live"][0] and runs["source"][0] == "live-sim"
    count = lambda: int(reader.sql("SELECT count(*) AS n FROM requests")["n"][0])  # noqa: E731
    first = wait_until(count, what="request rows")
    wait_until(lambda: count() > first, what="more request rows", timeout_s=20)
    nodes = reader.nodes()
    assert nodes["node_id"].to_list() == [0, 1, 2, 3]
