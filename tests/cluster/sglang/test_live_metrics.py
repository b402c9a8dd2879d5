"""/metrics and /v1/models of a live PD cluster over SGLang stand-ins on loopback.

The histograms and counters come from the rows the proxy and the engines' forward-pass
collectors write: their counts equal the requests and passes the database stored, with or
without a database (the server taps the rows either way). `/v1/models` answers OpenAI's
shape with the engines' served model.
"""

from __future__ import annotations

import asyncio

import httpx
from prometheus_client.parser import text_string_to_metric_families

from cluster.engines.standin.server import DEFAULT_MODEL
from telemetry import open_reader


async def _requests(url: str, n: int) -> list[int]:
    async with httpx.AsyncClient() as c:
        rs = await asyncio.gather(
            *(
                c.post(
                    f"{url}/generate",
                    json={
                        "input_ids": [7000 + i] * (30 + 50 * i),
                        "sampling_params": {"max_new_tokens": 4 + 3 * i},
                    },
                    timeout=60,
                )
                for i in range(n)
            )
        )
    return [r.status_code for r in rs]


def _samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_histograms_count_what_the_database_stored(live_cluster, until) -> None:  # type: ignore[no-untyped-def]
    h = live_cluster(("prefill", "decode"))
    assert set(asyncio.run(_requests(h.url, 6))) == {200}
    n_prefill = lambda: h.cluster.engines[0].prefill_iterations  # noqa: E731
    n_decode = lambda: h.cluster.engines[1].decode_iterations  # noqa: E731

    def settled() -> bool:
        s = _samples(h.url)
        return (
            s[("pdlab_e2e_request_latency_seconds_count", ())] == 6
            and s[("pdlab_iteration_duration_seconds_count", (("node", "0"), ("phase", "prefill")))]
            == n_prefill()
            and s[("pdlab_iteration_duration_seconds_count", (("node", "1"), ("phase", "decode")))]
            == n_decode()
        )

    assert until(settled, 10.0), _samples(h.url)
    s = _samples(h.url)
    node0, node1 = (("node", "0"),), (("node", "1"),)
    assert s[("pdlab_time_to_first_token_seconds_count", node0)] == 6
    assert s[("pdlab_request_time_per_output_token_seconds_count", node1)] == 6
    assert s[("pdlab_request_success_total", ())] == 6
    assert s[("pdlab_requests_completed_total", ())] == 6
    models = httpx.get(f"{h.url}/v1/models", timeout=10).json()
    h.close()

    r = open_reader(h.db)
    req = r.table("requests")
    assert req.height == 6
    assert s[("pdlab_prompt_tokens_total", node0)] == req["t_in"].sum()
    assert s[("pdlab_generation_tokens_total", node1)] == req["t_out"].sum()
    ttft = (req["t_first_token"] - req["t_arrival"]).sum()
    assert abs(s[("pdlab_time_to_first_token_seconds_sum", node0)] - ttft) < 1e-6
    passes = r.table("prefill_iterations")
    assert s[("pdlab_iteration_duration_seconds_count", (*node0, ("phase", "prefill")))] == (
        passes.height
    )
    assert (
        abs(
            s[("pdlab_iteration_duration_seconds_sum", (*node0, ("phase", "prefill")))]
            - passes["duration_s"].sum()
        )
        < 1e-6
    )
    assert s[("pdlab_prefill_computed_tokens_total", node0)] == passes["t_uc"].sum()
    # OpenAI's model list: what GET /v1/models answers on the data plane.
    assert models["object"] == "list"
    assert [(m["id"], m["object"], m["owned_by"]) for m in models["data"]] == [
        (DEFAULT_MODEL, "model", "pdlab")
    ]
    assert isinstance(models["data"][0]["created"], int)


def test_metrics_without_a_database(live_cluster, until) -> None:  # type: ignore[no-untyped-def]
    h = live_cluster(("prefill", "decode"), db=False)
    assert set(asyncio.run(_requests(h.url, 3))) == {200}
    assert until(lambda: _samples(h.url)[("pdlab_request_success_total", ())] == 3, 10.0)
    s = _samples(h.url)
    assert s[("pdlab_e2e_request_latency_seconds_count", ())] == 3
    assert s[("pdlab_iteration_duration_seconds_count", (("node", "1"), ("phase", "decode")))] > 0
