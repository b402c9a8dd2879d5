"""Engine discovery from /server_info (SGLang's descriptor rules) and the JSON cluster file."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.core import ConfigError
from cluster.sglang.cluster_file import (
    EngineSpec,
    discover_engine,
    load_cluster_file,
    save_cluster_file,
    spec_from_server_info,
)
from cluster.sglang.standin import StandinEngine

SGLANG_INFO = {  # the shape of SGLang 0.5.23's /server_info, trimmed to what is read
    "served_model_name": "Qwen/Qwen3-8B",
    "disaggregation_mode": "prefill",
    "disaggregation_bootstrap_port": 8998,
    "enable_forward_pass_metrics": True,
    "forward_pass_metrics_ipc_name": "ipc:///tmp/tmpabc",
    "kv_events": {
        "publisher": "zmq",
        "endpoint_host": "*",
        "endpoint_port_base": 5557,
        "topic": "kv",
        "block_size": 64,
        "dp_size": 2,
        "replay_endpoint_port_base": 5558,
    },
}


def test_sglang_descriptor_substitutes_the_worker_host_and_offsets_dp_ranks() -> None:
    spec = spec_from_server_info(SGLANG_INFO, "http://10.0.0.7:30000/", node_id=4, dp_rank=1)
    assert spec == EngineSpec(
        node_id=4,
        http_url="http://10.0.0.7:30000",
        role="prefill",
        name="Qwen/Qwen3-8B",
        kv_events="tcp://10.0.0.7:5558",
        kv_replay="tcp://10.0.0.7:5559",
        kv_topic="kv",
        block_size=64,
        forward_metrics="ipc:///tmp/tmpabc.1",
        bootstrap_port=8998,
    )
    bare = spec_from_server_info({"kv_events": None}, "http://h:1", node_id=0)
    assert bare.kv_events is None and bare.forward_metrics is None and bare.role == "null"


def test_discover_a_running_standin_and_round_trip_the_file(tmp_path: Path) -> None:
    with StandinEngine("prefill") as engine:
        ep = engine.endpoints
        assert ep is not None
        spec = discover_engine(ep.http_url, node_id=2)
    assert (spec.kv_events, spec.kv_replay, spec.forward_metrics) == (
        ep.kv_events,
        ep.kv_replay,
        ep.forward_metrics,
    )
    assert spec.role == "prefill" and spec.bootstrap_port == ep.bootstrap_port
    path = tmp_path / "cluster.json"
    other = EngineSpec(node_id=3, http_url="http://127.0.0.1:9", role="decode")
    save_cluster_file(path, [spec, other])
    assert load_cluster_file(path) == [spec, other]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("{}", "JSON list"),
        ('[{"node_id": 1}]', "needs node_id and http_url"),
        ('[{"node_id": 1, "http_url": "http://a", "gpu": 1}]', "unknown fields ['gpu']"),
        ('[{"node_id": 1, "http_url": "a:1"}]', "http://"),
        (
            '[{"node_id": 1, "http_url": "http://a"}, {"node_id": 1, "http_url": "http://b"}]',
            "unique",
        ),
        ("not json", "cannot read"),
    ],
)
def test_bad_cluster_files_say_what_is_wrong(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "c.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_cluster_file(path)
    assert needle in str(err.value)


def test_discover_reports_an_unreachable_engine() -> None:
    with pytest.raises(ConfigError, match="server_info"):
        discover_engine("http://127.0.0.1:9", node_id=0, timeout_s=1.0)
