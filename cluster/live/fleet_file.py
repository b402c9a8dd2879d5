"""A running fleet pdlab watches but did not start (`pdlab attach`): its endpoints (SPEC §6).

A fleet file is TOML (or JSON) with a `[fleet]` table of `FleetSettings` and one
`[[engines]]` table per engine (`AttachedEngine`: at least `url`); on the command line each
`--engine URL[,key=value...]` is one engine with the same keys. What an engine leaves out
is discovered: an engine that answers GET /server_info speaks SGLang (SGLang, pdlab's torch
engine, the SGLang stand-in: role, KV event publisher, forward-pass metrics, page size, KV
capacity, whether it takes /pd_role_switch); otherwise GET /v1/models and /metrics say
whether it is vLLM (`vllm:` metric names; `vllm:cache_config_info` gives block size and
GPU blocks). vLLM advertises neither its KV event publisher (`--kv-events-config`) nor
pdlab's step stream (`PDLAB_VLLM_STEPS`), nor its P/D role (the proxy decides it): give
`kv_events`, `vllm_steps` and `role` in the file.

    [fleet]
    router_url = "http://10.0.0.9:8000"   # the fleet's own router/proxy, if any
    profile = "h200"                      # models until the fleet's own fits replace them

    [[engines]]
    url = "http://10.0.0.1:8100"
    role = "prefill"
    kv_events = "tcp://10.0.0.1:5557"
    vllm_steps = "tcp://10.0.0.1:5590"

    [[engines]]
    url = "http://10.0.0.2:30000"         # SGLang: everything else from /server_info
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import httpx

from cluster.core import ConfigError
from cluster.input_files import read_text
from cluster.live.cluster_file import spec_from_server_info
from cluster.live.prom_scrape import engine_load, parse_metrics

KINDS = ("auto", "sglang", "vllm")
ROLES = ("prefill", "decode", "null")


@dataclass(frozen=True, slots=True)
class AttachedEngine:
    """One engine of an attached fleet and where it publishes (module docstring)."""

    url: str
    node_id: int | None = None  # default: its position in the fleet
    kind: str = "auto"  # sglang | vllm (auto: discovered)
    role: str = "null"  # prefill | decode | null (collocated)
    name: str = ""
    metrics_url: str | None = None  # default {url}/metrics; "" disables scraping
    kv_events: str | None = None
    kv_replay: str | None = None
    kv_topic: str = ""
    forward_metrics: str | None = None  # SGLang's (or vLLM's native) forward-pass metrics
    vllm_steps: str | None = None  # pdlab's vLLM stat-logger plugin stream
    vllm_steps_replay: str | None = None
    block_size: int | None = None
    kv_capacity_tokens: int | None = None
    chunk_tokens: int | None = None
    enable_pd_role_switch: bool | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"engine url must start with http:// or https://, got {self.url!r}")
        if self.kind not in KINDS:
            raise ConfigError(f"engine {self.url}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.role not in ROLES:
            raise ConfigError(f"engine {self.url}: role must be one of {ROLES}, got {self.role!r}")
        for name in (
            "kv_events",
            "kv_replay",
            "forward_metrics",
            "vllm_steps",
            "vllm_steps_replay",
        ):
            v = getattr(self, name)
            if v is not None and not v.startswith(("tcp://", "ipc://", "inproc://")):
                raise ConfigError(
                    f"engine {self.url}: {name} must be a ZMQ endpoint (tcp://HOST:PORT), got {v!r}"
                )

    @property
    def scrape_url(self) -> str | None:
        if self.metrics_url == "":
            return None
        return self.metrics_url or f"{self.url.rstrip('/')}/metrics"

    @property
    def can_switch(self) -> bool:
        return self.kind == "sglang" and bool(self.enable_pd_role_switch) and self.role != "null"


@dataclass(frozen=True, slots=True)
class FleetSettings:
    """The `[fleet]` table: what pdlab assumes and how often it looks (seconds)."""

    router_url: str | None = None
    block_tokens: int | None = None
    profile: str = "h200"
    hardware: str = "unknown"
    router: str = "ttft"
    planner: str = "gain"
    window_s: float = 60.0
    slices: int = 4
    scrape_every_s: float = 1.0
    health_failures: int = 2
    refit_every_s: float = 10.0
    refit_min_rows: int = 20
    moe_top_k: int = 0
    moe_experts: int = 0
    catch_up: bool = True
    flush_every_s: float = 2.0
    switch_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        for name in ("window_s", "scrape_every_s", "flush_every_s", "switch_timeout_s"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise ConfigError(f"[fleet] {name} must be a number > 0, got {v!r}")
        if self.slices < 2 or self.health_failures < 1 or self.refit_min_rows < 5:
            raise ConfigError(
                "[fleet] slices must be >= 2, health_failures >= 1, refit_min_rows >= 5"
            )
        if self.moe_experts < 0 or (
            self.moe_experts and not 0 < self.moe_top_k <= self.moe_experts
        ):
            raise ConfigError("[fleet] need 1 <= moe_top_k <= moe_experts, or moe_experts = 0")


@dataclass(frozen=True, slots=True)
class FleetConfig:
    engines: tuple[AttachedEngine, ...]
    settings: FleetSettings = field(default_factory=FleetSettings)
    source: str = ""

    def numbered(self) -> FleetConfig:
        """Every engine with a node id (its position unless given); ids unique."""
        out = [
            e if e.node_id is not None else replace(e, node_id=i)
            for i, e in enumerate(self.engines)
        ]
        ids = [e.node_id for e in out]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"engine node ids must be unique, got {ids}")
        return replace(self, engines=tuple(out))


def _engine(raw: Any, where: str) -> AttachedEngine:
    if not isinstance(raw, dict) or "url" not in raw:
        raise ConfigError(f"{where}: every engine needs a url")
    known = {f.name for f in fields(AttachedEngine)}
    unknown = set(raw) - known
    if unknown:
        raise ConfigError(
            f"{where}: unknown engine keys {sorted(unknown)}; allowed: {', '.join(sorted(known))}"
        )
    try:
        return AttachedEngine(**raw)
    except TypeError as e:
        raise ConfigError(f"{where}: {e}") from None


def load_fleet_file(path: str | Path) -> FleetConfig:
    """Parse a fleet file (TOML `[fleet]` + `[[engines]]`, or the same as JSON)."""
    p = Path(path)
    where = f"fleet file {p}"
    try:
        text = read_text(p, what="fleet file")  # bounded; its errors name the file
        doc: Any = tomllib.loads(text) if p.suffix.lower() == ".toml" else json.loads(text)
    except (OSError, tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"cannot read {where}: {e}") from None
    if not isinstance(doc, dict) or set(doc) - {"fleet", "engines"}:
        raise ConfigError(f"{where} must hold a [fleet] table and [[engines]] entries only")
    engines = doc.get("engines")
    if not isinstance(engines, list) or not engines:
        raise ConfigError(f"{where}: needs at least one [[engines]] entry")
    raw = doc.get("fleet") or {}
    known = {f.name for f in fields(FleetSettings)}
    if not isinstance(raw, dict) or set(raw) - known:
        raise ConfigError(f"{where}: [fleet] takes {', '.join(sorted(known))}")
    return FleetConfig(tuple(_engine(e, where) for e in engines), FleetSettings(**raw), str(p))


def parse_engine_arg(arg: str) -> AttachedEngine:
    """`URL[,key=value...]` (the keys of a fleet file's engine) -> an `AttachedEngine`."""
    url, *pairs = arg.split(",")
    raw: dict[str, Any] = {"url": url}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"--engine {arg!r}: expected key=value after the URL, got {pair!r}")
        raw[key.strip()] = _value(value.strip())
    return _engine(raw, f"--engine {arg!r}")


def _value(v: str) -> Any:
    if v.lower() in ("true", "false"):
        return v.lower() == "true"
    try:
        return int(v)
    except ValueError:
        return v


def discover(e: AttachedEngine, timeout_s: float = 5.0) -> AttachedEngine:
    """Fill what `e` leaves out from the engine itself (module docstring); given fields win."""
    base = e.url.rstrip("/")
    with httpx.Client(timeout=timeout_s) as c:
        info = _json(c, f"{base}/server_info") if e.kind in ("auto", "sglang") else None
        if info is not None:
            found = spec_from_server_info(info, base, e.node_id or 0)
            return _fill(e, kind="sglang", role=found.role, name=found.name,
                         kv_events=found.kv_events, kv_replay=found.kv_replay,
                         kv_topic=found.kv_topic, forward_metrics=found.forward_metrics,
                         block_size=found.block_size, kv_capacity_tokens=found.kv_capacity_tokens,
                         chunk_tokens=found.chunk_tokens,
                         enable_pd_role_switch=found.enable_pd_role_switch)  # fmt: skip
        models = _json(c, f"{base}/v1/models")
        text = _text(c, e.scrape_url) if e.scrape_url else None
    if models is None and text is None:
        raise ConfigError(f"engine {e.url} answers neither /server_info, /v1/models nor /metrics")
    name = ""
    if isinstance(models, dict) and models.get("data"):
        name = str(models["data"][0].get("id") or "")
    load = engine_load(parse_metrics(text or ""))
    kind = "vllm" if load.style == "vllm" else ("sglang" if load.style == "sglang" else e.kind)
    if kind == "auto":
        raise ConfigError(f"engine {e.url}: cannot tell SGLang from vLLM; give kind = ...")
    cap = load.block_size * load.num_gpu_blocks if load.block_size and load.num_gpu_blocks else None
    return _fill(
        e, kind=kind, name=name, block_size=load.block_size or None, kv_capacity_tokens=cap
    )


def _fill(e: AttachedEngine, **found: Any) -> AttachedEngine:
    default = AttachedEngine(url=e.url)
    kw = {k: v for k, v in found.items() if getattr(e, k) == getattr(default, k) and v is not None}
    return replace(e, **kw)


def _json(c: httpx.Client, url: str) -> Any:
    try:
        r = c.get(url)
        return r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def _text(c: httpx.Client, url: str) -> str | None:
    try:
        r = c.get(url)
        return r.text if r.status_code == 200 else None
    except httpx.HTTPError:
        return None
