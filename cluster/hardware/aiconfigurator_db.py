"""AIConfigurator's measured kernel database, read as tables (SPEC §10: hardware nobody here owns).

NVIDIA's `aiconfigurator-core` package (Apache-2.0, extra `pdlab[aic]`) ships, per system
(h100_sxm, h200_sxm, b200_sxm, gb200, ...), backend (vllm, sglang, trtllm) and backend
version, Parquet tables of kernels timed on that GPU under that engine's kernels:
`gemm_perf` (m, n, k, dtype), `context_attention_perf` (batch, isl, heads, KV heads,
head dim, KV dtype), `generation_attention_perf` (batch, KV length, ...), `moe_perf`
(tokens, hidden, intermediate, top-k, experts, MoE TP/EP, dtype, routing distribution:
balanced or power-law), `custom_allreduce_perf` / `nccl_perf` (GPUs, message elements),
all in milliseconds, and a system spec YAML (memory bandwidth and capacity, NVLink).

`KernelDatabase` reads the rows one model needs (Parquet filters: a few thousand of the
~10^5 rows) and records every table it read and with which keys (`uses`), so a profile
names the rows it is built from. Version: the requested one when its directory exists,
else the package's `current` version for the backend (systems/query_versions.yaml),
else the newest present; the version used is recorded per table.

Interpolation between measured points (`curves`): GEMM latency in log space over (n, k)
(a kernel's time is a power law in its dimensions between grid points) and linearly in m
on the measured m grid; attention linearly in the sequence axis per batch size; above the
last measured point a table extends by the secant over its upper half
(`operator_tables.Table1D`).
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from cluster.core import ConfigError
from cluster.hardware.operator_tables import Table1D

FloatArray = npt.NDArray[np.float64]
MS = 1e-3
INSTALL_HINT = (
    "AIConfigurator's kernel database is not installed: pip install 'pdlab[aic]' "
    "(aiconfigurator-core), or pass --aic-systems DIR"
)


class AicMissing(ConfigError):
    """aiconfigurator-core is not installed and no systems directory was given."""


def package_systems_dir() -> Path:
    """The installed aiconfigurator-core's `systems/` directory (AicMissing if absent)."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or spec.origin is None:
        raise AicMissing(INSTALL_HINT)
    return Path(spec.origin).parent / "systems"


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)) or (0,)


@dataclass(frozen=True, slots=True)
class SystemSpec:
    """What the system YAML says about one GPU and its node."""

    name: str
    mem_bw_bytes_s: float
    mem_capacity_bytes: int
    intra_node_bw_bytes_s: float
    inter_node_bw_bytes_s: float
    gpus_per_node: int

    @classmethod
    def load(cls, root: Path, system: str) -> SystemSpec:
        import yaml

        path = root / f"{system}.yaml"
        if not path.is_file():
            known = sorted(p.stem for p in root.glob("*.yaml") if (root / "data" / p.stem).is_dir())
            raise ConfigError(f"system {system!r} is not in {root}; systems: {', '.join(known)}")
        doc = yaml.safe_load(path.read_text())
        gpu, node = doc["gpu"], doc.get("node", {})
        return cls(
            system,
            float(gpu["mem_bw"]),
            int(gpu["mem_capacity"]),
            float(node.get("intra_node_bw", 0.0)),
            float(node.get("inter_node_bw", 0.0)),
            int(node.get("num_gpus_per_node", 8)),
        )


@dataclass(frozen=True, slots=True)
class TableUse:
    """One table a profile was built from: file (relative to systems/), keys, rows read."""

    table: str
    version: str
    keys: dict[str, Any]
    rows: int

    def to_json(self) -> dict[str, Any]:
        return {"table": self.table, "version": self.version, "keys": self.keys, "rows": self.rows}


def _secant_extend(x: FloatArray, y: FloatArray) -> Table1D:
    order = np.argsort(x)
    return Table1D(np.asarray(x, dtype=np.float64)[order], np.asarray(y, dtype=np.float64)[order])


@dataclass(frozen=True, slots=True)
class GemmTable:
    """Latency (s) of one GEMM dtype by (m, n, k): per measured (n, k) a curve over m."""

    curves: dict[tuple[int, int], Table1D]
    n_grid: tuple[int, ...]
    k_grid: tuple[int, ...]

    def _bracket(self, grid: tuple[int, ...], q: int) -> list[tuple[int, float]]:
        g = np.asarray(grid, dtype=np.float64)
        if q in grid:
            return [(q, 1.0)]
        i = int(np.searchsorted(g, q))
        lo, hi = (0, 1) if i == 0 else (len(g) - 2, len(g) - 1) if i >= len(g) else (i - 1, i)
        t = (np.log(q) - np.log(g[lo])) / (np.log(g[hi]) - np.log(g[lo]))
        return [(int(g[lo]), 1.0 - t), (int(g[hi]), t)]

    def __call__(self, m: FloatArray, n: int, k: int) -> FloatArray:
        """Seconds of an (m x k) @ (k x n) GEMM at each m: log-bilinear in (n, k)."""
        logt = np.zeros(len(m))
        for nn, wn in self._bracket(self.n_grid, n):
            for kk, wk in self._bracket(self.k_grid, k):
                logt += wn * wk * np.log(np.maximum(self.curves[(nn, kk)](m), 1e-9))
        return np.exp(logt)


@dataclass(frozen=True, slots=True)
class BatchTable:
    """Latency (s) by (batch, x): per measured batch size a curve over x; linear in batch."""

    curves: dict[int, Table1D]

    def __call__(self, batch: float, x: FloatArray) -> FloatArray:
        bs = sorted(self.curves)
        b = min(max(batch, bs[0]), bs[-1]) if len(bs) == 1 else batch
        i = int(np.searchsorted(bs, b))
        if b in self.curves:
            return np.asarray(self.curves[int(b)](x))
        lo, hi = (
            (bs[0], bs[1]) if i == 0 else (bs[-2], bs[-1]) if i >= len(bs) else (bs[i - 1], bs[i])
        )
        t = (b - lo) / (hi - lo)
        v0, v1 = np.asarray(self.curves[lo](x)), np.asarray(self.curves[hi](x))
        return np.maximum(v0 + t * (v1 - v0), 0.0)


@dataclass
class KernelDatabase:
    """The tables of one (system, backend, version) under `root` (a `systems/` directory)."""

    system: str
    backend: str
    version: str | None = None
    root: Path | None = None
    uses: list[TableUse] = field(default_factory=list)
    _cache: dict[tuple[Any, ...], tuple[Any, list[TableUse]]] = field(
        default_factory=dict, repr=False
    )

    def __post_init__(self) -> None:
        self.root = Path(self.root) if self.root is not None else package_systems_dir()
        if not (self.root / "data").is_dir():
            raise ConfigError(f"{self.root}: not an AIConfigurator systems directory (no data/)")
        self.spec = SystemSpec.load(self.root, self.system)

    def _current(self, backend: str) -> str | None:
        path = self.root / "query_versions.yaml"  # type: ignore[operator]
        if not path.is_file():
            return None
        import yaml

        doc = yaml.safe_load(path.read_text()) or {}
        slot = (doc.get("overrides", {}).get(self.system, {}) or {}).get(backend) or doc.get(
            "defaults", {}
        ).get(backend, {})
        return (slot or {}).get("current")

    def table_path(self, op: str, filename: str, backend: str | None = None) -> tuple[Path, str]:
        """The Parquet file of `op` and the version it comes from (module docstring)."""
        be = backend or self.backend
        base = self.root / "data" / self.system / op / be  # type: ignore[operator]
        versions = sorted(
            (d.name for d in base.iterdir() if (d / filename).is_file()) if base.is_dir() else (),
            key=_version_key,
        )
        if not versions:
            raise ConfigError(
                f"{self.system}/{be}: no {op} table ({filename}) in the kernel database"
            )
        current = self._current(be)
        for v in (self.version, current):
            if v is not None and v in versions:
                return base / v / filename, v
        return base / versions[-1] / filename, versions[-1]

    def _read(
        self,
        op: str,
        filename: str,
        keys: dict[str, Any],
        columns: list[str],
        backend: str | None = None,
    ) -> dict[str, np.ndarray]:
        import pyarrow.parquet as pq

        path, version = self.table_path(op, filename, backend)
        filters = [
            (k, "in", list(v)) if isinstance(v, tuple) else (k, "=", v) for k, v in keys.items()
        ]
        t = pq.read_table(path, columns=columns, filters=filters or None)
        rel = str(path.relative_to(self.root)) if self.root else str(path)
        plain = {k: list(v) if isinstance(v, tuple) else v for k, v in keys.items()}
        self.uses.append(TableUse(rel, version, plain, t.num_rows))
        return {c: t.column(c).to_numpy(zero_copy_only=False) for c in columns}

    def _cached(self, key: tuple[Any, ...], build: Any) -> Any:
        """Read each table once per database; every call still records the tables it used."""
        hit = self._cache.get(key)
        if hit is None:
            start = len(self.uses)
            try:
                value = build()
            except ConfigError as exc:
                self._cache[key] = (exc, self.uses[start:])
                raise
            hit = self._cache[key] = (value, self.uses[start:])
        else:
            self.uses.extend(hit[1])
        if isinstance(hit[0], ConfigError):
            raise hit[0]
        return hit[0]

    def gemm(self, dtype: str | tuple[str, ...]) -> GemmTable:
        """GEMM seconds of `dtype` (or the fastest of several dtypes) by (m, n, k)."""
        dtypes = (dtype,) if isinstance(dtype, str) else tuple(dtype)
        return self._cached(("gemm", dtypes), lambda: self._gemm(dtypes))

    def _gemm(self, dtypes: tuple[str, ...]) -> GemmTable:
        d = self._read(
            "gemm", "gemm_perf.parquet", {"gemm_dtype": dtypes}, ["m", "n", "k", "latency"]
        )
        if not len(d["m"]):
            raise ConfigError(
                f"{self.system}/{self.backend}: no GEMM rows of dtype {' or '.join(dtypes)}"
            )
        best: dict[tuple[int, int], dict[int, float]] = {}
        for m, n, k, lat in zip(d["m"], d["n"], d["k"], d["latency"], strict=True):
            row = best.setdefault((int(n), int(k)), {})
            row[int(m)] = min(row.get(int(m), np.inf), float(lat) * MS)  # fastest kernel
        curves = {
            nk: _secant_extend(np.array(list(r), dtype=float), np.array(list(r.values())))
            for nk, r in best.items()
        }
        return GemmTable(
            curves, tuple(sorted({n for n, _ in curves})), tuple(sorted({k for _, k in curves}))
        )

    def _attention(
        self,
        filename: str,
        xcol: str,
        heads: int,
        kv_heads: int,
        head_dim: int,
        kv_dtype: str,
        window: int,
    ) -> BatchTable:
        keys = {
            "num_heads": heads,
            "num_key_value_heads": kv_heads,
            "head_dim": head_dim,
            "kv_cache_dtype": kv_dtype,
            "window_size": window,
        }
        d = self._read("attention", filename, keys, ["batch_size", "isl", "step", "latency"])
        if not len(d["latency"]):
            raise ConfigError(
                f"{self.system}/{self.backend}: no {filename.split('_perf')[0]} rows for "
                f"{heads} heads / {kv_heads} KV heads / head_dim {head_dim} / KV {kv_dtype}"
            )
        x = d["isl"] + d["step"] if xcol == "kv" else d["isl"]
        by: dict[int, dict[float, float]] = {}
        for b, xv, lat in zip(d["batch_size"], x, d["latency"], strict=True):
            row = by.setdefault(int(b), {})
            row[float(xv)] = min(row.get(float(xv), np.inf), float(lat) * MS)
        return BatchTable(
            {
                b: _secant_extend(np.array(list(r)), np.array(list(r.values())))
                for b, r in by.items()
                if len(r) >= 2
            }
        )

    def context_attention(
        self, heads: int, kv_heads: int, head_dim: int, kv_dtype: str = "bfloat16", window: int = 0
    ) -> BatchTable:
        """Prefill attention by (batch, isl): `batch` sequences of `isl` new tokens, no cache."""
        key = ("ctx", heads, kv_heads, head_dim, kv_dtype, window)
        return self._cached(
            key,
            lambda: self._attention(
                "context_attention_perf.parquet", "isl", heads, kv_heads, head_dim, kv_dtype, window
            ),
        )

    def generation_attention(
        self, heads: int, kv_heads: int, head_dim: int, kv_dtype: str = "bfloat16", window: int = 0
    ) -> BatchTable:
        """Decode attention by (batch, KV length = isl + step): one token per sequence."""
        key = ("gen", heads, kv_heads, head_dim, kv_dtype, window)
        return self._cached(
            key,
            lambda: self._attention(
                "generation_attention_perf.parquet",
                "kv",
                heads,
                kv_heads,
                head_dim,
                kv_dtype,
                window,
            ),
        )

    def moe(
        self,
        hidden: int,
        inter: int,
        top_k: int,
        experts: int,
        moe_tp: int,
        moe_ep: int,
        dtype: str | tuple[str, ...],
        distribution: str,
    ) -> Table1D:
        """One MoE layer's compute on one rank (s) by the tokens entering the layer (the
        fastest of several dtypes when `dtype` is a tuple)."""
        dtype = dtype if isinstance(dtype, str) else tuple(dtype)
        args = (hidden, inter, top_k, experts, moe_tp, moe_ep, dtype, distribution)
        return self._cached(("moe", *args), lambda: self._moe(*args))

    def _moe(
        self,
        hidden: int,
        inter: int,
        top_k: int,
        experts: int,
        moe_tp: int,
        moe_ep: int,
        dtype: str | tuple[str, ...],
        distribution: str,
    ) -> Table1D:
        keys = {
            "hidden_size": hidden,
            "inter_size": inter,
            "topk": top_k,
            "num_experts": experts,
            "moe_tp_size": moe_tp,
            "moe_ep_size": moe_ep,
            "moe_dtype": dtype,
            "distribution": distribution,
        }
        d = self._read("moe", "moe_perf.parquet", keys, ["num_tokens", "latency"])
        if not len(d["latency"]):
            names = dtype if isinstance(dtype, str) else " or ".join(dtype)
            raise ConfigError(
                f"{self.system}/{self.backend}: no MoE rows for {experts} experts top-{top_k} "
                f"{hidden}x{inter} {names} at MoE TP {moe_tp} / EP {moe_ep} ({distribution})"
            )
        best: dict[float, float] = {}
        for t, lat in zip(d["num_tokens"], d["latency"], strict=True):
            best[float(t)] = min(best.get(float(t), np.inf), float(lat) * MS)
        return _secant_extend(np.array(list(best)), np.array(list(best.values())))

    def moe_rows(
        self, hidden: int, inter: int, top_k: int, experts: int, dtype: str
    ) -> dict[str, np.ndarray]:
        """Every MoE row of one expert shape and dtype (all parallelisms and distributions)."""
        keys = {
            "hidden_size": hidden,
            "inter_size": inter,
            "topk": top_k,
            "num_experts": experts,
            "moe_dtype": dtype,
        }
        cols = ["num_tokens", "moe_tp_size", "moe_ep_size", "distribution", "latency"]
        return self._read("moe", "moe_perf.parquet", keys, cols)

    def allreduce(self, num_gpus: int) -> Table1D:
        """All-reduce seconds by message elements (bf16) over `num_gpus` GPUs: the engine's
        custom all-reduce (its CUDA-graph variant when measured), else NCCL."""
        return self._cached(("allreduce", num_gpus), lambda: self._allreduce(num_gpus))

    def _allreduce(self, num_gpus: int) -> Table1D:
        try:
            path, _ = self.table_path("comm", "custom_allreduce_perf.parquet")
            import pyarrow.parquet as pq

            names = set(pq.read_schema(path).names)
            keys: dict[str, Any] = {"num_gpus": num_gpus}
            if "backend" in names:
                keys["backend"] = f"{self.backend}_graph"
            d = self._read(
                "comm", "custom_allreduce_perf.parquet", keys, ["message_size", "latency"]
            )
            if not len(d["latency"]) and "backend" in keys:
                del keys["backend"]
                d = self._read(
                    "comm", "custom_allreduce_perf.parquet", keys, ["message_size", "latency"]
                )
        except ConfigError:
            d = {"latency": np.array([])}
        if not len(d["latency"]):
            keys = {"num_gpus": num_gpus, "op_name": "all_reduce", "nccl_dtype": "half"}
            try:
                d = self._read(
                    "comm", "nccl_perf.parquet", keys, ["message_size", "latency"], backend="nccl"
                )
            except ConfigError:
                d = {"latency": np.array([])}
        if not len(d["latency"]):
            raise ConfigError(f"{self.system}: no all-reduce rows for {num_gpus} GPUs")
        best: dict[float, float] = {}
        for s, lat in zip(d["message_size"], d["latency"], strict=True):
            best[float(s)] = min(best.get(float(s), np.inf), float(lat) * MS)
        return _secant_extend(np.array(list(best)), np.array(list(best.values())))
