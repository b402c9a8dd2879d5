"""Engines of a live SGLang cluster: discovery from /server_info and the cluster file (SPEC §6).

SGLang 0.5.23 advertises its KV event publisher under `/server_info`'s `kv_events` key
(`runtime_context.describe_kv_events_publisher`): {publisher, endpoint_host,
endpoint_port_base, topic, block_size, dp_size, replay_endpoint_port_base?, ...}; rank r
listens on port base + r, and a wildcard endpoint_host ("*", "0.0.0.0", "::") must be
replaced by the worker URL's host. Forward-pass metrics are bound on
`{forward_pass_metrics_ipc_name}.{dp_rank}` (IPC, same host only); pdlab's engines name
theirs (`forward_pass_metrics_endpoint`; a torch DP group one per rank in
`forward_pass_metrics_endpoints`). `discover_engine` turns
that into an `EngineSpec`. `pdlab collect --server` reads one engine; the live control plane
(`pdlab serve --sglang CLUSTER_FILE`) reads a cluster file: TOML (or JSON) with a `[cluster]`
table of `ClusterSettings` and one `[[engines]]` table per engine (`EngineSpec` fields; at
least node_id and http_url, the rest is discovered through /server_info unless given). A
JSON list of engines (`save_cluster_file`) is also a cluster file with default settings.

    [cluster]
    tokenizer = "engine"          # engine | toy | none | hf:<model>
    router = "ttft"               # any cluster.control.routing router
    planner = "static"            # any cluster.control.planning planner; planner_mode advise
    moe_top_k = 8                 # the model's MoE shape (0/0 = dense) for phi(B)
    moe_experts = 256
    relaunch_command = "ssh {host} ./relaunch-sglang.sh --role {role} --port {port}"

    [[engines]]
    node_id = 0
    http_url = "http://10.0.0.1:30000"    # role, publishers, bootstrap port: discovered

    [[engines]]
    node_id = 1
    http_url = "http://10.0.0.2:30000"
    decode_cuda_graph_memory_gb = 4.0     # only if no decode peer reports it
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx

from cluster.core import ConfigError
from cluster.input_files import read_text

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
    # Live-cluster fields (the cluster file; discovery fills the last three).
    bootstrap_host: str | None = None  # default: the host of http_url
    relaunch_command: str | None = None  # overrides [cluster] relaunch_command
    decode_cuda_graph_memory_gb: float | None = None  # first flip to decode (SGLang check)
    chunk_tokens: int | None = None  # chunked_prefill_size
    kv_capacity_tokens: int | None = None  # max_total_num_tokens
    enable_pd_role_switch: bool | None = None

    def __post_init__(self) -> None:
        if isinstance(self.node_id, bool) or not isinstance(self.node_id, int):
            raise ConfigError(f"node_id must be an integer, got {self.node_id!r}")
        if self.node_id < 0:
            raise ConfigError(f"node_id must be >= 0, got {self.node_id}")
        if not isinstance(self.http_url, str):
            raise ConfigError(f"http_url must be a string, got {self.http_url!r}")
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
        ranks = info.get("forward_pass_metrics_endpoints")  # a torch DP group: one per rank
        if isinstance(ranks, list) and 0 <= dp_rank < len(ranks):
            fpm = ranks[dp_rank]
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
        chunk_tokens=_opt_int(info.get("chunked_prefill_size")),
        kv_capacity_tokens=_opt_int(info.get("max_total_num_tokens")),
        enable_pd_role_switch=(
            bool(info["enable_pd_role_switch"]) if "enable_pd_role_switch" in info else None
        ),
    )


def _opt_int(v: Any) -> int | None:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) and v > 0 else None


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
    """The engines of a JSON list file (or of a TOML cluster file, see `load_cluster_config`)."""
    if Path(path).suffix.lower() == ".toml":
        return list(load_cluster_config(path).engines)
    try:
        raw = json.loads(read_text(path, what="cluster file"))
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"cannot read cluster file {path}: {e}") from None
    if not isinstance(raw, list):
        raise ConfigError(f"cluster file {path} must hold a JSON list of engines")
    return _engine_specs(raw, f"cluster file {path}")


def _engine_specs(items: list[Any], where: str) -> list[EngineSpec]:
    """The engines of a cluster file's list, each checked (node_id and http_url given, known
    fields, a PD role), node ids unique; errors name `where`."""
    known = {f.name for f in fields(EngineSpec)}
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or "node_id" not in item or "http_url" not in item:
            raise ConfigError(f"{where}: engine {i} needs node_id and http_url")
        unknown = set(item) - known
        if unknown:
            raise ConfigError(
                f"{where}: engine {i} has unknown fields {sorted(unknown)}; "
                f"allowed: {', '.join(sorted(known))}"
            )
        if "role" in item and item["role"] not in ("prefill", "decode", "null"):
            raise ConfigError(
                f"{where}: engine {i} role must be prefill or decode, got {item['role']!r}"
            )
        out.append(EngineSpec(**item))
    ids = [e.node_id for e in out]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{where}: node ids must be unique, got {ids}")
    return out


# --- the live cluster file (TOML / JSON) ---------------------------------------------------

Tokenizer = str  # "engine" | "toy" | "none" | "hf:<name or path>"
KVFetch = Literal["none", "async", "sync"]


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    """The `[cluster]` table: control-plane policies and the data plane's behaviour.

    `block_tokens` defaults to the engines' page size (their KV events' block_size); the
    directory and request paths must use the engines' page size to match. `kv_fetch` is
    "none" by default: SGLang engines do not read each other's KV unless a shared HiCache
    storage backend is configured ("async" then lets the router credit remote prefixes).
    `profile` gives the iteration-time models the router and planner use until fits replace
    them (a preset of `cluster.hardware.profiles` or a `pdlab fit --json` file).
    """

    block_tokens: int | None = None
    tokenizer: Tokenizer = "engine"
    router: str = "ttft"
    decode_binder: str = "fewest"
    planner: str = "static"
    planner_mode: str = "advise"
    window_s: float = 600.0
    slices: int = 10
    kv_fetch: KVFetch = "none"
    copy_price_s_per_token: float = 0.0
    profile: str = "h200"
    hardware: str = "unknown"
    moe_top_k: int = 0
    moe_experts: int = 0  # 0 = dense model (phi = 0)
    t_acc: float = 1.0  # accepted tokens per decode iteration (speculative decoding)
    discover: bool = True
    catch_up: bool = True  # replay each KV publisher's buffer when the collector joins
    api_key: str | None = None  # engines started with --api-key
    health_interval_s: float = 1.0
    health_failures: int = 2  # consecutive failed checks before a node is marked down
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 600.0
    max_retries: int = 2  # extra attempts on another engine before the first token
    drain_timeout_s: float = 300.0
    switch_timeout_s: float = 120.0  # waiting for /pd_role_switch and the verification
    relaunch_command: str | None = None
    relaunch_timeout_s: float = 600.0
    decode_cuda_graph_memory_gb: float | None = None
    flush_every_s: float = 2.0
    refit_every_s: float = 30.0  # online refit of the nodes' models (0 = keep the profile)
    refit_min_rows: int = 20  # passes of a phase a node needs before its refit
    branch_counts_every_s: float = 2.0  # push R_b to engines serving /kv_eviction (0 = never)

    def __post_init__(self) -> None:
        for name in (
            "window_s",
            "health_interval_s",
            "connect_timeout_s",
            "request_timeout_s",
            "drain_timeout_s",
            "switch_timeout_s",
            "relaunch_timeout_s",
            "flush_every_s",
        ):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise ConfigError(f"[cluster] {name} must be a number > 0, got {v!r}")
        if self.block_tokens is not None and (
            not isinstance(self.block_tokens, int) or self.block_tokens <= 0
        ):
            raise ConfigError(
                f"[cluster] block_tokens must be an integer > 0, got {self.block_tokens!r}"
            )
        if self.kv_fetch not in ("none", "async", "sync"):
            raise ConfigError(
                f"[cluster] kv_fetch must be none, async or sync, got {self.kv_fetch!r}"
            )
        if self.planner_mode not in ("auto", "advise", "off"):
            raise ConfigError(
                f"[cluster] planner_mode must be auto, advise or off, got {self.planner_mode!r}"
            )
        tok = self.tokenizer
        if tok not in ("engine", "toy", "none") and not (tok.startswith("hf:") and len(tok) > 3):
            raise ConfigError(
                f"[cluster] tokenizer must be engine, toy, none or hf:<model name or path>, "
                f"got {tok!r}"
            )
        if self.max_retries < 0 or self.health_failures < 1 or self.slices < 2:
            raise ConfigError(
                "[cluster] max_retries must be >= 0, health_failures >= 1 and slices >= 2"
            )
        if self.moe_experts < 0 or (
            self.moe_experts > 0 and not 0 < self.moe_top_k <= self.moe_experts
        ):
            raise ConfigError(
                f"[cluster] need 1 <= moe_top_k <= moe_experts, or moe_experts = 0 (dense); "
                f"got moe_top_k={self.moe_top_k}, moe_experts={self.moe_experts}"
            )
        if not (self.refit_every_s >= 0 and self.refit_min_rows >= 5):
            raise ConfigError(
                f"[cluster] refit_every_s must be >= 0 (0 = off) and refit_min_rows >= 5, got "
                f"{self.refit_every_s}, {self.refit_min_rows}"
            )
        v = self.branch_counts_every_s
        if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
            raise ConfigError(f"[cluster] branch_counts_every_s must be >= 0 (0 = off), got {v!r}")
        if not self.t_acc > 0:
            raise ConfigError(f"[cluster] t_acc must be > 0, got {self.t_acc}")


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """A parsed cluster file: settings and engines (possibly not yet discovered)."""

    engines: tuple[EngineSpec, ...]
    settings: ClusterSettings = field(default_factory=ClusterSettings)
    source: str = ""

    def block_tokens(self) -> int:
        """The KV block size of the directory and request paths: `[cluster] block_tokens`,
        else the page size the engines advertise (they must agree)."""
        given = self.settings.block_tokens
        sizes = {e.block_size for e in self.engines if e.block_size}
        if len(sizes) > 1:
            raise ConfigError(f"engines publish different KV block sizes {sorted(sizes)}")
        block_tokens = given or (next(iter(sizes)) if sizes else None)
        if block_tokens is None:
            raise ConfigError(
                "no engine advertises its KV block size (kv_events.block_size in /server_info);"
                " set [cluster] block_tokens to the engines' --page-size"
            )
        if sizes and block_tokens not in sizes and given is not None:
            raise ConfigError(
                f"[cluster] block_tokens = {block_tokens} but the engines' page size is "
                f"{sizes.pop()}: request paths would never match the stored blocks"
            )
        return block_tokens

    def discovered(self, timeout_s: float = 10.0) -> ClusterConfig:
        """Fill each engine's missing fields from its /server_info (given fields win).

        With `[cluster] discover = false` the engines are used as written. Every engine of a
        live PD cluster must end up with role prefill or decode.
        """
        engines = []
        for e in self.engines:
            if self.settings.discover:
                found = discover_engine(e.http_url, e.node_id, timeout_s=timeout_s)
                if (
                    e.role != "null"
                    and found.role in ("prefill", "decode")
                    and e.role != found.role
                ):
                    raise ConfigError(
                        f"engine {e.node_id} ({e.http_url}) serves {found.role} but the cluster "
                        f"file says {e.role}; drop role from the file or fix it"
                    )
                e = merge_discovered(e, found)
            if e.role not in ("prefill", "decode"):
                raise ConfigError(
                    f"engine {e.node_id} ({e.http_url}) has role {e.role!r}; a PD cluster needs "
                    "prefill or decode (start SGLang with --disaggregation-mode, or set role)"
                )
            engines.append(e)
        return replace(self, engines=tuple(engines))


def merge_discovered(given: EngineSpec, found: EngineSpec) -> EngineSpec:
    """`given` with every field it leaves at its default taken from `found`."""
    defaults = EngineSpec(node_id=given.node_id, http_url=given.http_url)
    out = {}
    for f in fields(EngineSpec):
        mine = getattr(given, f.name)
        out[f.name] = getattr(found, f.name) if mine == getattr(defaults, f.name) else mine
    out["http_url"] = given.http_url.rstrip("/")
    return EngineSpec(**out)


def _settings(raw: Any, where: str) -> ClusterSettings:
    if raw is None:
        return ClusterSettings()
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: [cluster] must be a table of settings")
    known = {f.name for f in fields(ClusterSettings)}
    unknown = set(raw) - known
    if unknown:
        raise ConfigError(
            f"{where}: [cluster] has unknown settings {sorted(unknown)}; "
            f"allowed: {', '.join(sorted(known))}"
        )
    try:
        return ClusterSettings(**raw)
    except TypeError as e:
        raise ConfigError(f"{where}: [cluster] {e}") from None


def _engines(raw: Any, where: str) -> tuple[EngineSpec, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where}: needs at least one [[engines]] entry")
    return tuple(_engine_specs(raw, where))


def load_cluster_config(path: str | Path) -> ClusterConfig:
    """Parse a cluster file: TOML (`[cluster]` + `[[engines]]`) or JSON (the same as an
    object, or a plain list of engines). Engines are not contacted (see `discovered`)."""
    p = Path(path)
    where = f"cluster file {p}"
    try:
        text = read_text(p, what="cluster file")  # bounded; its errors name the file
    except OSError as e:
        raise ConfigError(f"cannot read {where}: {e}") from None
    if p.suffix.lower() == ".toml":
        try:
            doc: Any = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{where} is not valid TOML: {e}") from None
    else:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where} is not valid JSON: {e}") from None
        if isinstance(doc, list):
            doc = {"engines": doc}
    if not isinstance(doc, dict):
        raise ConfigError(f"{where} must hold [cluster] settings and [[engines]]")
    unknown = set(doc) - {"cluster", "engines"}
    if unknown:
        raise ConfigError(
            f"{where}: unknown top-level keys {sorted(unknown)}; allowed: cluster, engines"
        )
    return ClusterConfig(
        _engines(doc.get("engines"), where), _settings(doc.get("cluster"), where), str(p)
    )
