"""Fixtures: load SGLang 0.5.23's own wire modules from its wheel, without installing sglang.

The wheel (~40 MB) is downloaded once with `pip download --no-deps` into ~/.cache/pdlab/wheels.
`kv_events.py` is loaded by path with only `sglang.srt.runtime_context` stubbed (its
`get_parallel` is only used by the scheduler-side helpers); `utils/network.py` (psutil, zmq)
and `observability/forward_pass_metrics.py` load unchanged from the wheel.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest

SGLANG_VERSION = "0.5.23"
CACHE = Path.home() / ".cache" / "pdlab" / "wheels"
MODULES = {
    "sglang.srt.utils.network": "sglang/srt/utils/network.py",
    "sglang.srt.disaggregation.kv_events": "sglang/srt/disaggregation/kv_events.py",
    "sglang.srt.observability.forward_pass_metrics": "sglang/srt/observability/forward_pass_metrics.py",
}


def wheel_path() -> Path:
    found = sorted(CACHE.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
    if found:
        return found[0]
    CACHE.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        f"sglang=={SGLANG_VERSION}",
        "--no-deps",
        "-d",
        str(CACHE),
        "-q",
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"cannot download the sglang {SGLANG_VERSION} wheel: {e}")
    found = sorted(CACHE.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
    if proc.returncode != 0 or not found:
        pytest.skip(f"cannot download the sglang {SGLANG_VERSION} wheel: {proc.stderr[-500:]}")
    return found[0]


def load_sglang_modules(
    tmp_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, types.ModuleType]:
    """Extract and import SGLang's wire modules; sys.modules entries are undone by monkeypatch."""
    whl = wheel_path()
    with zipfile.ZipFile(whl) as z:
        for member in MODULES.values():
            z.extract(member, tmp_dir)
    for pkg in (
        "sglang",
        "sglang.srt",
        "sglang.srt.utils",
        "sglang.srt.disaggregation",
        "sglang.srt.observability",
    ):
        mod = types.ModuleType(pkg)
        mod.__path__ = []  # a namespace-like stub package
        monkeypatch.setitem(sys.modules, pkg, mod)
    runtime_context = types.ModuleType("sglang.srt.runtime_context")

    def get_parallel() -> types.SimpleNamespace:
        return types.SimpleNamespace(pp_rank=0, attn_tp_rank=0, attn_cp_rank=0)

    runtime_context.get_parallel = get_parallel  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sglang.srt.runtime_context", runtime_context)
    loaded: dict[str, types.ModuleType] = {}
    for name, member in MODULES.items():
        spec = importlib.util.spec_from_file_location(name, tmp_dir / member)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, module)
        spec.loader.exec_module(module)
        loaded[name.rsplit(".", 1)[1]] = module
    return loaded


@pytest.fixture
def sglang_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, types.ModuleType]:
    """SGLang 0.5.23's kv_events, network and forward_pass_metrics modules, from its wheel."""
    return load_sglang_modules(tmp_path, monkeypatch)


# --- live clusters on loopback (proxy, end-to-end, role-switch and fault tests) --------------

TOKEN = "test-token"


class LiveHarness:
    """Stand-in engines, an `SGLangCluster` over them and its app served on loopback."""

    def __init__(self, engines: list, cluster: object, server: object, db: Path | None) -> None:
        self.engines = engines
        self.cluster = cluster
        self.server = server
        self.db = db
        self.url: str = server.url  # type: ignore[attr-defined]
        self.auth = {"Authorization": f"Bearer {TOKEN}"}
        self.closed = False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.server.stop()  # type: ignore[attr-defined]  # stops the cluster, closes the run
        import threading

        stops = [
            threading.Thread(target=e.stop)
            for e in self.engines
            if e is not None and not isinstance(e, str)
        ]
        for t in stops:
            t.start()
        for t in stops:
            t.join(10.0)


@pytest.fixture
def live_cluster(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Factory: `make(roles, **settings)` -> LiveHarness; everything is stopped at teardown.

    `engines` replaces the stand-ins: started StandinEngines, or URLs of engines served
    elsewhere (stand-in processes); node i is engines[i]. `standin` passes StandinEngine
    kwargs; other keywords are `ClusterSettings`.
    """
    from cluster.engines.standin.server import StandinEngine
    from cluster.live.cluster import SGLangCluster
    from cluster.live.cluster_file import ClusterConfig, ClusterSettings, EngineSpec
    from cluster.live.serving import ServerThread
    from toolkit.serve.sglang import create_sglang_app

    made: list[LiveHarness] = []

    def make(
        roles: tuple[str, ...] = ("prefill", "prefill", "decode"),
        *,
        engines: list | None = None,
        standin: dict | None = None,
        db: bool = True,
        **settings: object,
    ) -> LiveHarness:
        if engines is None:
            kw = {"enable_pd_role_switch": True} | (standin or {})
            engines = [StandinEngine(r, **kw) for r in roles]  # type: ignore[arg-type]
            for e in engines:
                e.start()
        # An engine is a started StandinEngine or the URL of one served elsewhere (a process).
        urls = [e if isinstance(e, str) else e.endpoints.http_url for e in engines]
        specs = [EngineSpec(node_id=i, http_url=u) for i, u in enumerate(urls)]
        base = {
            "tokenizer": "engine",
            "moe_top_k": 8,
            "moe_experts": 64,
            "health_interval_s": 0.2,
            "decode_cuda_graph_memory_gb": 1.0,
        }
        cfg = ClusterConfig(tuple(specs), ClusterSettings(**(base | settings)))  # type: ignore[arg-type]
        path = tmp_path / f"live{len(made)}.duckdb" if db else None
        cluster = SGLangCluster(cfg, db_path=path)
        server = ServerThread(create_sglang_app(cluster, TOKEN))
        try:
            server.start()
        except BaseException:
            for e in engines:
                if not isinstance(e, str):
                    e.stop()
            raise
        h = LiveHarness(engines, cluster, server, path)
        made.append(h)
        return h

    yield make
    for h in reversed(made):
        h.close()


def wait_until(pred, timeout_s: float = 10.0, every_s: float = 0.02) -> bool:  # type: ignore[no-untyped-def]
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(every_s)
    return bool(pred())


@pytest.fixture
def until():  # type: ignore[no-untyped-def]
    """`until(pred, timeout_s)`: poll a condition (tests of live, threaded components)."""
    return wait_until
