"""Fleet files and --engine arguments of `pdlab attach`, discovery, and /metrics parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.core import ConfigError
from cluster.engines.standin.server import StandinEngine
from cluster.live.fleet_file import (
    AttachedEngine,
    discover,
    load_fleet_file,
    parse_engine_arg,
)
from cluster.live.prom_scrape import engine_load, parse_metrics

VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",num_gpu_blocks="2588"} 1.0
# TYPE vllm:request_success counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 7.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 3.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 4.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 10.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 10.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 2.5
"""


def test_vllm_metrics_give_the_load_summed_over_dp_ranks() -> None:
    samples = parse_metrics(VLLM_METRICS)
    assert not any(s.name.endswith("_bucket") for s in samples)
    load = engine_load(samples)
    assert load.style == "vllm" and (load.running, load.waiting) == (5.0, 1.0)
    assert load.kv_usage == pytest.approx(0.375) and load.requests == 10.0
    assert (load.block_size, load.num_gpu_blocks) == (16, 2588)
    assert (load.ttft_sum, load.ttft_count) == (2.5, 10.0)
    assert engine_load(parse_metrics("# nothing\n")).style is None


def test_fleet_file_and_engine_args(tmp_path: Path) -> None:
    f = tmp_path / "fleet.toml"
    f.write_text(
        '[fleet]\nrouter_url = "http://10.0.0.9:8000"\nwindow_s = 30\n'
        '[[engines]]\nurl = "http://10.0.0.1:8100"\nrole = "prefill"\n'
        'kv_events = "tcp://10.0.0.1:5557"\n[[engines]]\nurl = "http://10.0.0.2:8100"\n'
    )
    cfg = load_fleet_file(f).numbered()
    assert [e.node_id for e in cfg.engines] == [0, 1] and cfg.settings.window_s == 30
    assert cfg.engines[0].scrape_url == "http://10.0.0.1:8100/metrics"
    e = parse_engine_arg("http://h:8000,role=decode,kind=vllm,vllm_steps=tcp://h:5590,node_id=4")
    assert (e.role, e.kind, e.vllm_steps, e.node_id) == ("decode", "vllm", "tcp://h:5590", 4)
    for bad, msg in [
        ("http://h:8000,role=middle", "role must be one of"),
        ("http://h:8000,kv_events=h:5557", "must be a ZMQ endpoint"),
        ("http://h:8000,colour=red", "unknown engine keys"),
        ("h:8000", "must start with http"),
        ("http://h:8000,role", "expected key=value"),
    ]:
        with pytest.raises(ConfigError, match=msg):
            parse_engine_arg(bad)
    f.write_text('[fleet]\nwindow_s = -1\n[[engines]]\nurl = "http://h:1"\n')
    with pytest.raises(ConfigError, match="window_s must be a number > 0"):
        load_fleet_file(f)


def test_discovery_tells_sglang_from_vllm() -> None:
    with (
        StandinEngine("prefill", wire="vllm") as v,
        StandinEngine("decode", enable_pd_role_switch=True) as s,
    ):
        dv = discover(AttachedEngine(url=v.endpoints.http_url, role="prefill"))
        assert (dv.kind, dv.role, dv.block_size, dv.kv_capacity_tokens) == (
            "vllm",
            "prefill",
            16,
            8192 * 16,
        )
        assert dv.kv_events is None and dv.name == "pdlab/standin-toy"  # vLLM advertises none
        ds = discover(AttachedEngine(url=s.endpoints.http_url))
        assert (ds.kind, ds.role, ds.enable_pd_role_switch) == ("sglang", "decode", True)
        assert ds.kv_events == s.endpoints.kv_events and ds.forward_metrics is not None
        assert ds.can_switch and not dv.can_switch
    with pytest.raises(ConfigError, match="answers neither"):
        discover(AttachedEngine(url="http://127.0.0.1:9"), timeout_s=0.5)


def test_attach_cli_refuses_bad_fleets_in_one_line() -> None:
    from typer.testing import CliRunner

    from toolkit.cli import app

    r = CliRunner()
    none = r.invoke(app, ["attach"])
    assert none.exit_code == 2 and "give a fleet file or at least one --engine" in none.output
    dead = r.invoke(app, ["attach", "--engine", "http://127.0.0.1:9"])
    assert dead.exit_code == 2 and "answers neither" in dead.output
    assert "Traceback" not in none.output + dead.output
