"""Engine discovery from /server_info (SGLang's descriptor rules) and the JSON cluster file."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.core import ConfigError
from cluster.engines.standin.server import StandinEngine
from cluster.live.cluster_file import (
    EngineSpec,
    discover_engine,
    load_cluster_file,
    save_cluster_file,
    spec_from_server_info,
)

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
        ('[{"node_id": 0, "http_url": "http://a", "role": "both"}]', "role must be"),
    ],
)
def test_bad_cluster_files_say_what_is_wrong(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "c.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_cluster_file(path)
    assert needle in str(err.value)


def test_discover_reports_an_unreachable_engine(closed_port: int) -> None:
    with pytest.raises(ConfigError, match="server_info"):
        discover_engine(f"http://127.0.0.1:{closed_port}", node_id=0, timeout_s=1.0)


# --- the live cluster file (TOML / JSON with [cluster] settings) -----------------------------

TOML = """
[cluster]
tokenizer = "toy"
router = "cache-aware"
planner = "gain"
planner_mode = "off"
moe_top_k = 8
moe_experts = 64
relaunch_command = "ssh {host} restart-sglang --role {role}"

[[engines]]
node_id = 0
http_url = "http://127.0.0.1:30000/"

[[engines]]
node_id = 1
http_url = "http://127.0.0.1:30001"
role = "decode"
decode_cuda_graph_memory_gb = 3.5
"""


def test_toml_cluster_file_settings_and_engines(tmp_path: Path) -> None:
    from cluster.live.cluster_file import ClusterSettings, load_cluster_config

    path = tmp_path / "cluster.toml"
    path.write_text(TOML)
    cfg = load_cluster_config(path)
    s = cfg.settings
    assert (s.tokenizer, s.router, s.planner, s.planner_mode) == (
        "toy",
        "cache-aware",
        "gain",
        "off",
    )
    assert (s.moe_top_k, s.moe_experts, s.kv_fetch) == (8, 64, "none")
    assert s.relaunch_command == "ssh {host} restart-sglang --role {role}"
    assert [e.node_id for e in cfg.engines] == [0, 1]
    assert cfg.engines[1].role == "decode" and cfg.engines[1].decode_cuda_graph_memory_gb == 3.5
    assert load_cluster_file(path) == list(cfg.engines)  # the engines-only reader accepts TOML
    # A JSON list of engines is a cluster file with default settings.
    save_cluster_file(tmp_path / "c.json", list(cfg.engines))
    assert load_cluster_config(tmp_path / "c.json").settings == ClusterSettings()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            "[cluster]\ntokenizer = 'bpe'\n[[engines]]\nnode_id = 0\nhttp_url = 'http://a'",
            "hf:<model",
        ),
        (
            "[cluster]\nspeed = 2\n[[engines]]\nnode_id = 0\nhttp_url = 'http://a'",
            "unknown settings ['speed']",
        ),
        (
            "[cluster]\nkv_fetch = 'rdma'\n[[engines]]\nnode_id = 0\nhttp_url = 'http://a'",
            "kv_fetch must be",
        ),
        (
            "[cluster]\nmoe_top_k = 9\nmoe_experts = 8\n[[engines]]\nnode_id = 0\nhttp_url = 'http://a'",
            "moe_top_k <= moe_experts",
        ),
        (
            "[cluster]\nhealth_interval_s = 0\n[[engines]]\nnode_id = 0\nhttp_url = 'http://a'",
            "health_interval_s must be",
        ),
        ("[cluster]\n", "at least one [[engines]]"),
        (
            "[[engines]]\nnode_id = 0\nhttp_url = 'http://a'\nrole = 'both'",
            "role must be prefill or decode",
        ),
        ("[[engine]]\nnode_id = 0", "unknown top-level keys ['engine']"),
        ("[[engines]]\nnode_id = 'x'\nhttp_url = 'http://a'", "node_id must be an integer"),
        ("not = [toml", "not valid TOML"),
    ],
)
def test_bad_toml_cluster_files_say_what_is_wrong(tmp_path: Path, text: str, needle: str) -> None:
    from cluster.live.cluster_file import load_cluster_config

    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_cluster_config(path)
    assert needle in str(err.value)


def test_discovery_fills_the_rest_and_refuses_a_role_mismatch() -> None:
    from cluster.live.cluster_file import ClusterConfig

    with StandinEngine("prefill", enable_pd_role_switch=True) as engine:
        ep = engine.endpoints
        assert ep is not None
        given = EngineSpec(node_id=0, http_url=ep.http_url, relaunch_command="x {role}")
        cfg = ClusterConfig((given,)).discovered()
        e = cfg.engines[0]
        assert (e.role, e.kv_events, e.bootstrap_port) == (
            "prefill",
            ep.kv_events,
            ep.bootstrap_port,
        )
        assert e.relaunch_command == "x {role}" and e.enable_pd_role_switch is True
        assert e.block_size == 16 and e.chunk_tokens == 8192 and e.kv_capacity_tokens
        wrong = ClusterConfig((EngineSpec(node_id=0, http_url=ep.http_url, role="decode"),))
        with pytest.raises(ConfigError, match="serves prefill but the cluster file says decode"):
            wrong.discovered()
    null = ClusterConfig((EngineSpec(node_id=0, http_url="http://127.0.0.1:9", role="null"),))
    with pytest.raises(ConfigError, match="server_info"):
        null.discovered(timeout_s=1.0)


def test_block_tokens_come_from_the_settings_or_the_engines_page_size() -> None:
    from cluster.live.cluster_file import ClusterConfig, ClusterSettings

    def cfg(sizes: list[int | None], given: int | None = None) -> ClusterConfig:
        engines = tuple(
            EngineSpec(node_id=i, http_url=f"http://e{i}:1", block_size=b)
            for i, b in enumerate(sizes)
        )
        return ClusterConfig(engines, ClusterSettings(block_tokens=given))

    assert cfg([16, 16, None]).block_tokens() == 16
    assert cfg([None], given=32).block_tokens() == 32
    assert cfg([16], given=16).block_tokens() == 16
    with pytest.raises(ConfigError, match=r"different KV block sizes \[16, 64\]"):
        cfg([16, 64]).block_tokens()
    with pytest.raises(ConfigError, match="no engine advertises its KV block size"):
        cfg([None, None]).block_tokens()
    with pytest.raises(ConfigError, match="block_tokens = 32 but the engines' page size is 16"):
        cfg([16], given=32).block_tokens()
