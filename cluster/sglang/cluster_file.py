"""Engines of a live SGLang cluster: discovery from /server_info and a JSON cluster file (SPEC §6).

SGLang 0.5.23 advertises its KV event publisher under `/server_info`'s `kv_events` key
(`runtime_context.describe_kv_events_publisher`): {publisher, endpoint_host,
endpoint_port_base, topic, block_size, dp_size, replay_endpoint_port_base?, ...}; rank r
listens on port base + r, and a wildcard endpoint_host ("*", "0.0.0.0", "::") must be
replaced by the worker URL's host. Forward-pass metrics are bound on
`{forward_pass_metrics_ipc_name}.{dp_rank}` (IPC, same host only). `discover_engine` turns
that into an `EngineSpec`; a cluster file is a JSON list of them, the input of the live
control plane (phase 2) and of `pdlab collect --server`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from cluster.core import ConfigError

_WILDCARDS = ("*", "0.0.0.0", "::", "[::]")


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """Where one engine (one DP rank) serves HTTP and publishes KV events and FPM."""

    node_id: int
    http_url: str
    role: str = "null"
    name: str = ""
    kv_events: str | None = None
    kv_replay: str | None = None
    kv_topic: str = ""
    block_size: int | None = None
    forward_metrics: str | None = None
    bootstrap_port: int | None = None

    def __post_init__(self) -> None:
        if self.node_id < 0:
            raise ConfigError(f"node_id must be >= 0, got {self.node_id}")
        if not self.http_url.startswith(("http://", "https://")):
            raise ConfigError(
                f"http_url must start with http:// or https://, got {self.http_url!r}"
            )


def spec_from_server_info(
    info: dict[str, Any], http_url: str, node_id: int, dp_rank: int = 0
) -> EngineSpec:
    """An `EngineSpec` from a /server_info document (SGLang or the SGLang stand-in)."""
    url_host = urlsplit(http_url).hostname or "127.0.0.1"
    kv = info.get("kv_events") or None
    kv_events = kv_replay = None
    topic, block_size = "", None
    if isinstance(kv, dict) and kv.get("publisher") == "zmq":
        host = str(kv.get("endpoint_host", url_host))
        host = url_host if host in _WILDCARDS else host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        kv_events = f"tcp://{host}:{int(kv['endpoint_port_base']) + dp_rank}"
        if kv.get("replay_endpoint_port_base") is not None:
            kv_replay = f"tcp://{host}:{int(kv['replay_endpoint_port_base']) + dp_rank}"
        topic = str(kv.get("topic") or "")
        block_size = int(kv["block_size"]) if kv.get("block_size") else None
    fpm = None
    if info.get("enable_forward_pass_metrics"):
        fpm = info.get("forward_pass_metrics_endpoint")  # the stand-in names it outright
        if fpm is None and info.get("forward_pass_metrics_ipc_name"):
            fpm = f"{info['forward_pass_metrics_ipc_name']}.{dp_rank}"
    mode = str(info.get("disaggregation_mode") or "null")
    return EngineSpec(
        node_id=node_id,
        http_url=http_url.rstrip("/"),
        role=mode,
        name=str(info.get("served_model_name") or ""),
        kv_events=kv_events,
        kv_replay=kv_replay,
        kv_topic=topic,
        block_size=block_size,
        forward_metrics=fpm,
        bootstrap_port=info.get("disaggregation_bootstrap_port") if mode == "prefill" else None,
    )


def discover_engine(
    http_url: str, node_id: int, dp_rank: int = 0, timeout_s: float = 10.0
) -> EngineSpec:
    """GET {http_url}/server_info and describe the engine's publishers."""
    try:
        r = httpx.get(f"{http_url.rstrip('/')}/server_info", timeout=timeout_s)
        r.raise_for_status()
        info = r.json()
    except (httpx.HTTPError, ValueError) as e:
        raise ConfigError(f"cannot read {http_url}/server_info: {e}") from None
    return spec_from_server_info(info, http_url, node_id, dp_rank)


def save_cluster_file(path: str | Path, engines: list[EngineSpec]) -> None:
    ids = [e.node_id for e in engines]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"node ids must be unique, got {ids}")
    Path(path).write_text(json.dumps([asdict(e) for e in engines], indent=2) + "\n")


def load_cluster_file(path: str | Path) -> list[EngineSpec]:
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"cannot read cluster file {path}: {e}") from None
    if not isinstance(raw, list):
        raise ConfigError(f"cluster file {path} must hold a JSON list of engines")
    known = {f.name for f in fields(EngineSpec)}
    engines = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or "node_id" not in item or "http_url" not in item:
            raise ConfigError(f"cluster file {path}: engine {i} needs node_id and http_url")
        unknown = set(item) - known
        if unknown:
            raise ConfigError(
                f"cluster file {path}: engine {i} has unknown fields {sorted(unknown)}; "
                f"allowed: {', '.join(sorted(known))}"
            )
        engines.append(EngineSpec(**item))
    ids = [e.node_id for e in engines]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"cluster file {path}: node ids must be unique, got {ids}")
    return engines
