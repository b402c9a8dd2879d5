"""REST fuzz (hypothesis): random requests against a real `pdlab serve` on loopback.

Methods, paths (every route template with random segments, and random paths), query
strings, headers (token right, wrong, missing, odd schemes; any content type) and bodies
(random JSON with NaN and huge numbers, the API's own field names with hostile values, raw
bytes past the size limit). Every answer is a 2xx or 4xx with a JSON `detail` on errors —
never a 5xx or a hang (a 5 s timeout per request) — and after every example the server is
healthy: its pacing thread alive, its run not stopped. The last test checks the cluster still
advances and still switches a node.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from toolkit.client import ServerProcess, launch_server

TOKEN = "fuzz-token"

# Values that break naive handlers: huge, tiny, negative, non-finite, wrong types.
NASTY_NUMBERS = st.sampled_from(
    [0, -1, 1, 2, 3, 10, 100, 101, 2**31, 2**63, 10**12, 10**40, -(10**40), 1e308, -1e308,
     1e-308, 5e-324, 0.01, 0.0100001, 9.99, 86_400, 86_401, float("nan"), float("inf"),
     float("-inf"), True, False]
)  # fmt: skip
SCALARS = st.one_of(
    st.none(),
    NASTY_NUMBERS,
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=200),
    st.sampled_from(["auto", "advise", "off", "prefill", "decode", "ttft", "round-robin",
                     "least-loaded", "cache-aware", "sticky", "dynamo", "", " ", "NaN"]),
)  # fmt: skip
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6), st.dictionaries(st.text(max_size=20), inner, max_size=6)
    ),
    max_leaves=20,
)
FIELDS = st.sampled_from(["phase", "mode", "window_s", "slices", "policy", "copy_price"])
API_BODIES = st.dictionaries(FIELDS, SCALARS, max_size=4)
SEGMENTS = st.one_of(
    st.sampled_from(["0", "1", "2", "3", "4", "-1", "nan", "1e308", "2147483648", "x", ".."]),
    st.integers(-(10**40), 10**40).map(str),
    # control characters (DEL, C1) are refused by the client before any request is sent
    st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=0x2FF,
                                   exclude_characters="/?#%", exclude_categories=("Cc",)),
            min_size=1, max_size=300),
)  # fmt: skip
TEMPLATES = [
    "/v1/health", "/v1/cluster", "/v1/timeline", "/v1/planner", "/v1/planner/apply",
    "/v1/router", "/v1/branches", "/v1/branches/{}", "/v1/branches/{}/finish",
    "/v1/directory/stats", "/metrics", "/v1/nodes/{}/phase", "/openapi.json", "/docs",
    "/{}", "/v1/{}", "/v1/nodes/{}",
]  # fmt: skip
QUERY = st.dictionaries(
    st.sampled_from(["since", "limit", "x"]),
    st.one_of(NASTY_NUMBERS.map(str), st.text(max_size=40)),
    max_size=2,
)
AUTH = st.sampled_from(
    [f"Bearer {TOKEN}", f"Bearer {TOKEN}", None, "Bearer wrong", "Basic Zm9vOmJhcg==",
     "bearer " + TOKEN, f"Bearer {TOKEN} extra", "Bearer", ""]
)  # fmt: skip
CONTENT_TYPES = st.one_of(
    st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded",
                     "multipart/form-data; boundary=x", "application/json; charset=latin-1"]),
    st.none(),
    # h11 refuses, client-side, a header value with whitespace at either end
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40).filter(
        lambda v: v == v.strip()
    ),
)  # fmt: skip


# The API's own calls: well-formed requests that reach the handlers with hostile values.
API_CALLS = [
    ("POST", "/v1/nodes/{}/phase"), ("PUT", "/v1/planner"), ("PUT", "/v1/router"),
    ("POST", "/v1/planner/apply"), ("GET", "/v1/timeline"), ("GET", "/v1/branches"),
    ("GET", "/v1/branches/{}"),
]  # fmt: skip
NODE_SEGMENTS = st.one_of(st.integers(0, 4).map(str), SEGMENTS)


@st.composite
def api_calls(draw: st.DrawFn) -> dict[str, Any]:
    """A call of the API with the token, JSON, and nasty values in its fields."""
    method, template = draw(st.sampled_from(API_CALLS))
    path = template.format(draw(NODE_SEGMENTS)) if "{}" in template else template
    body = draw(st.dictionaries(FIELDS, st.one_of(NASTY_NUMBERS, SCALARS), max_size=2))
    return {"method": method, "url": path, "params": draw(QUERY),
            "content": json.dumps(body).encode(),
            "headers": {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}}  # fmt: skip


@st.composite
def anything(draw: st.DrawFn) -> dict[str, Any]:
    """Any method, path, query, headers and body."""
    template = draw(st.sampled_from(TEMPLATES))
    path = template.format(draw(SEGMENTS)) if "{}" in template else template
    kind = draw(st.sampled_from(["none", "api", "json", "bytes"]))
    body: bytes | None = None
    if kind == "api":
        body = json.dumps(draw(API_BODIES)).encode()
    elif kind == "json":
        body = json.dumps(draw(JSON)).encode()  # NaN and Infinity written as such
    elif kind == "bytes":
        body = draw(st.binary(max_size=6000))
    headers = {}
    auth = draw(AUTH)
    if auth is not None:
        headers["Authorization"] = auth
    ctype = draw(CONTENT_TYPES)
    if ctype is not None:
        headers["Content-Type"] = ctype
    method = draw(st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]))
    return {"method": method, "url": path, "params": draw(QUERY), "content": body,
            "headers": headers}  # fmt: skip


def put(path: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"method": "PUT", "url": path, "params": {}, "content": json.dumps(body).encode(),
            "headers": {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}}  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    db: Path = tmp_path_factory.mktemp("fuzz") / "fuzz.duckdb"
    srv = launch_server(
        "--nodes", "4", "--split", "2P2D", "--agents", "8", "--workload", "cc",
        "--window", "60", "--slices", "4",
        token=TOKEN, db=db, speed=10.0,
    )  # fmt: skip
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=5.0) as c:
        yield c


def healthy(http: httpx.Client) -> dict[str, Any]:
    h = http.get("/v1/health").json()
    assert h["status"] == "ok" and not h["finished"] and h["error"] is None, h
    return h


# No shrinking: each example is a request to a live server, and a failure (pytest-timeout's
# too, which Hypothesis takes for one) would be replayed hundreds of times, unbounded.
@settings(
    max_examples=150,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(req=st.one_of(api_calls(), anything()))
# Found by the outside tries: a slice loop that held the lock for good, a pacing thread that
# died on an infinite predicted TTFT.
@example(req=put("/v1/planner", {"slices": 10**12}))
@example(req=put("/v1/router", {"copy_price": 1e308}))
def test_any_request_gets_a_2xx_or_4xx_with_a_json_detail(
    http: httpx.Client, req: dict[str, Any]
) -> None:
    r = http.request(**req)
    assert r.status_code < 500, (req, r.status_code, r.text[:500])
    if r.status_code >= 400 and req["method"] != "HEAD":
        detail = r.json()["detail"]
        assert isinstance(detail, str) and detail and len(detail) < 1200, detail
    healthy(http)


def test_the_server_is_still_healthy_and_serving_after_the_fuzz(http: httpx.Client) -> None:
    before = healthy(http)
    time.sleep(1.0)
    after = healthy(http)
    assert after["time"] > before["time"] + 2  # 10x: the pacing thread advances the clock
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert http.put("/v1/planner", json={"mode": "advise"}, headers=auth).status_code == 200
    state = http.get("/v1/cluster").json()
    movable = [n for n in state["nodes"] if n["switching"] is None]
    by_phase = {p: [n for n in movable if n["phase"] == p] for p in ("prefill", "decode")}
    phase = "prefill" if len(by_phase["prefill"]) >= 2 else "decode"
    if len(by_phase[phase]) >= 2:  # a switch that keeps a node of each phase
        node = by_phase[phase][0]["id"]
        to = "decode" if phase == "prefill" else "prefill"
        r = http.post(f"/v1/nodes/{node}/phase", json={"phase": to}, headers=auth)
        assert r.status_code == 200 and r.json()["to_phase"] == to
