"""`GET /metrics` of a paced simulation: Prometheus histograms and counters that agree with the
run's database, served families equal to the catalogue, docs/metrics.md generated from it.

A 4-node cluster at 150x (the gain planner advising every 30 simulated seconds, one node
switched by hand through the REST API) is scraped over HTTP while it runs and after it
ends; the scrapes are parsed with prometheus_client's own parser.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cluster.server import ControlService, ServiceConfig, create_app
from cluster.server.metric_catalog import CATALOG, MetricSpec
from cluster.server.metrics_doc import metrics_markdown
from cluster.sglang.live.serving import ServerThread
from cluster.sim.paced import PaceConfig, PacedSimulation
from cluster.sim.simulator import SimConfig
from telemetry import open_reader

ROOT = Path(__file__).resolve().parents[3]
Key = tuple[str, tuple[tuple[str, str], ...]]


def _scrape(url: str) -> tuple[dict[str, str], dict[Key, float]]:
    """(family name -> type, (sample name, sorted labels) -> value) of one scrape."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    types, values = {}, {}
    for fam in text_string_to_metric_families(text):
        types[fam.name] = fam.type
        for s in fam.samples:
            values[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return types, values


def _by(values: dict[Key, float], name: str, label: str = "node") -> dict[str, float]:
    return {dict(k[1]).get(label, ""): v for k, v in values.items() if k[0] == name}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, ControlService]]:
    db = tmp_path_factory.mktemp("metrics") / "run.duckdb"
    cfg = SimConfig(workload="cc", nodes=4, split="2P2D", agents=24, duration_s=120.0,
                    warmup_s=0.0, window_s=30.0, slices=4, cooldown_s=5.0)  # fmt: skip
    engines = PacedSimulation(cfg, db, PaceConfig(speed=150.0, planner_mode="advise"))
    service = ControlService(engines, ServiceConfig(flush_every_s=0.3, sample_every_s=0.3))
    with ServerThread(create_app(service, "t", manage=False)) as server:
        service.start()
        try:
            r = httpx.post(f"{server.url}/v1/nodes/1/phase", json={"phase": "decode"},
                           headers={"Authorization": "Bearer t"}, timeout=10)  # fmt: skip
            assert r.status_code == 200, r.text
            yield server.url, db, service
        finally:
            service.stop()


def test_counters_and_histograms_only_grow_while_the_run_goes_on(
    served: tuple[str, Path, ControlService],
) -> None:
    url, _, service = served
    scrapes = []
    for _ in range(4):
        scrapes.append(_scrape(url))
        time.sleep(0.3)
    types = scrapes[0][0]
    grows = {n for n, t in types.items() if t in ("counter", "histogram")}

    def cumulative(s: Key) -> bool:
        name = s[0]
        return any(name in (f"{g}_total", f"{g}_bucket", f"{g}_count", f"{g}_sum") for g in grows)

    for (_, before), (_, after) in pairwise(scrapes):
        for key, v in before.items():
            if cumulative(key):
                assert after[key] >= v, key
    last = scrapes[-1][1]
    assert last[("pdlab_e2e_request_latency_seconds_count", ())] > 0
    # Within a scrape, buckets are cumulative and +Inf is the count.
    for (name, labels), v in last.items():
        if name.endswith("_count") and name.removesuffix("_count") in grows:
            base = name.removesuffix("_count")
            buckets = sorted(
                (float(dict(k[1])["le"]), bv)
                for k, bv in last.items()
                if k[0] == f"{base}_bucket" and tuple(x for x in k[1] if x[0] != "le") == labels
            )
            assert [b for _, b in buckets] == sorted(b for _, b in buckets), name
            assert buckets[-1] == (float("inf"), v), name
    assert service.engines.error is None


def test_histogram_counts_equal_the_requests_the_run_stored(
    served: tuple[str, Path, ControlService],
) -> None:
    url, db, service = served
    deadline = time.monotonic() + 60
    while service.engines.ended() is None:
        assert time.monotonic() < deadline, "the paced run did not reach its duration"
        time.sleep(0.2)
    service.stop()  # flushes the last rows: to the database and to the metrics alike
    types, s = _scrape(url)
    r = open_reader(db)
    req = r.table("requests")
    done = req.filter(req["t_done"].is_not_null())
    assert done.height > 100
    assert s[("pdlab_e2e_request_latency_seconds_count", ())] == done.height
    assert s[("pdlab_request_success_total", ())] == done.height == service.latency.completed
    assert s[("pdlab_requests_completed_total", ())] == done.height
    e2e = (done["t_done"] - done["t_arrival"]).sum()
    assert s[("pdlab_e2e_request_latency_seconds_sum", ())] == pytest.approx(e2e, rel=1e-9)
    per_prefill = Counter(str(n) for n in done["prefill_node"])
    ttft = _by(s, "pdlab_time_to_first_token_seconds_count")
    assert {n: c for n, c in ttft.items() if c} == per_prefill
    tpot = done.filter(done["t_out"] >= 2)
    tpot_count = _by(s, "pdlab_request_time_per_output_token_seconds_count")
    assert {n: c for n, c in tpot_count.items() if c} == Counter(
        str(n) for n in tpot["decode_node"]
    )
    prompt = _by(s, "pdlab_prompt_tokens_total")
    for n, group in done.group_by("prefill_node"):
        assert prompt[str(n[0])] == group["t_in"].sum()
    out = _by(s, "pdlab_generation_tokens_total")
    assert sum(out.values()) == done["t_out"].sum()
    # Forward passes: one observation per stored iteration, per node and phase.
    iters = {
        (dict(k[1])["node"], dict(k[1])["phase"]): v
        for k, v in s.items()
        if k[0] == "pdlab_iteration_duration_seconds_count"
    }
    for phase in ("prefill", "decode"):
        rows = r.table(f"{phase}_iterations")
        stored = Counter(str(n) for n in rows["node_id"])
        assert {n: c for (n, p), c in iters.items() if p == phase and c} == stored
    # The manual switch, counted once per node and direction.
    switches = r.table("phase_switches")
    assert switches.height == 1
    assert s[("pdlab_phase_switches_total", ())] == switches.height
    assert (
        s[
            (
                "pdlab_node_phase_switches_total",
                (
                    ("from_phase", "prefill"),
                    ("node", "1"),
                    ("to_phase", "decode"),
                    ("trigger", "manual"),
                ),
            )
        ]
        == 1
    )
    # The planner's last gain test is on the gauges; its split is the recommended one.
    gains = _by(s, "pdlab_planner_gain_requests_per_second", "prefill_nodes")
    assert gains and all(int(k) in (1, 2, 3) for k in gains)
    assert types["pdlab_kv_cache_usage_perc"] == "gauge"
    usage = [v for k, v in s.items() if k[0] == "pdlab_kv_cache_usage_perc"]
    assert len(usage) == 8 and all(0.0 <= u <= 1.0 for u in usage)


def _family_types(spec: MetricSpec) -> tuple[str, str]:
    return spec.base_name, spec.kind


def test_a_scrape_serves_exactly_the_catalogue(served: tuple[str, Path, ControlService]) -> None:
    url, _, _ = served
    text = httpx.get(f"{url}/metrics", timeout=10).text
    families = {
        f.name: f for f in text_string_to_metric_families(text) if not f.name.endswith("_created")
    }
    assert {n: f.type for n, f in families.items()} == dict(map(_family_types, CATALOG))
    for spec in CATALOG:
        for sample in families[spec.base_name].samples:
            extra = {"le"} if sample.name.endswith("_bucket") else set()
            assert set(sample.labels) == set(spec.labels) | extra, (spec.name, sample)


def test_metrics_reference_is_generated_from_the_catalogue() -> None:
    text = (ROOT / "docs" / "metrics.md").read_text()
    assert text == metrics_markdown(), (
        "regenerate: python -m cluster.server.metrics_doc > docs/metrics.md"
    )
    for spec in CATALOG:
        assert f"| `{spec.name}` | {spec.kind} |" in text
