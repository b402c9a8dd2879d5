"""LLMServingSim's cluster config and request files (`pdlab import lss-run`).

The cluster config (LLMServingSim's `cluster_config/*.json`) describes the machines a run
used: `link_bw` (GB/s) and `link_latency` (ns) between instances and GPUs; per node its CPU
memory (`cpu_mem.mem_size` GB, `mem_bw` GB/s: the prefix pool); per instance the model
(`model_name`), `hardware`, `npu_mem` (`mem_size` GB: weights and KV, `mem_bw` GB/s),
its GPUs (`npu_num`, or `num_npus` / `tp_size` in the newer format; `npu_group` pipeline
groups: only 1 is modelled) and `pd_type` (null, "prefill" or "decode").

A request file has one JSON object per line: `input_toks`, `output_toks`,
`arrival_time_ns` and, when known, `input_tok_ids` / `output_tok_ids` (real token ids; the
prefix caches replay them); a gzip copy `<name>.gz` stands in for a missing file. Errors
name the file, line and field.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.hardware.layer_tables import has_file
from toolkit.importers.fields import Fields, ImportFileError, load_json

ROLES = {None: "collocated", "prefill": "prefill", "decode": "decode"}


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    model: str
    hardware: str
    tp: int
    role: str  # collocated | prefill | decode
    gpu_memory_gib: float
    memory_gbps: float | None
    host_memory_gib: float | None
    host_memory_gbps: float | None
    node: int  # the config's node it is on


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    instances: tuple[InstanceSpec, ...]
    link_gbps: float | None
    link_latency_s: float | None
    doc: dict[str, Any]  # the config as read


@dataclass(frozen=True, slots=True)
class DatasetRequest:
    index: int
    arrival_s: float
    input_tokens: int
    output_tokens: int
    input_ids: tuple[int, ...] | None
    output_ids: tuple[int, ...] | None


def _positive(f: Fields, key: str, *, required: bool = False) -> float | None:
    v = f.number(key, required=required)
    if v is not None and v <= 0:
        raise f.fail(key, f"must be > 0, got {v}")
    return v


def read_cluster_config(path: str | Path) -> ClusterSpec:
    """The instances of an LLMServingSim cluster config, in its order (module docstring)."""
    p = Path(path)
    doc, text = load_json(p)
    top = Fields(doc, p, None, text)
    link = _positive(top, "link_bw")
    lat = top.number("link_latency")
    if lat is not None and lat < 0:
        raise top.fail("link_latency", f"must be >= 0 ns, got {lat}")
    nodes = top.array("nodes")
    if not nodes:
        raise top.fail("nodes", "missing or empty (a list of nodes with instances is required)")
    out: list[InstanceSpec] = []
    for n, raw in enumerate(nodes):
        node = Fields(raw, p, None, text, ("nodes",))
        cpu = node.sub("cpu_mem")
        host = _positive(cpu, "mem_size") if cpu else None
        host_bw = _positive(cpu, "mem_bw") if cpu else None
        insts = node.array("instances")
        if not insts:
            raise node.fail("instances", "missing or empty")
        for raw_i in insts:
            inst = Fields(raw_i, p, None, text, ("nodes", "instances"))
            model = inst.string("model_name", required=True)
            mem = inst.sub("npu_mem", required=True)
            assert mem is not None and model is not None
            gib = _positive(mem, "mem_size", required=True)
            tp = next(
                (
                    v
                    for k in ("npu_num", "tp_size", "num_npus")
                    if (v := inst.integer(k, minimum=1))
                ),
                None,
            )
            if tp is None:
                raise inst.fail("npu_num", "missing (the instance's GPU count is required)")
            groups = inst.integer("npu_group", minimum=1) or 1
            if groups != 1:
                raise inst.fail("npu_group", f"{groups} pipeline groups: only 1 is modelled")
            pd = inst.string("pd_type")
            if pd not in ROLES:
                raise inst.fail("pd_type", f"must be null, 'prefill' or 'decode', got {pd!r}")
            out.append(
                InstanceSpec(
                    model=model,
                    hardware=inst.string("hardware") or "unknown",
                    tp=tp,
                    role=ROLES[pd],
                    gpu_memory_gib=float(gib or 0),
                    memory_gbps=_positive(mem, "mem_bw"),
                    host_memory_gib=host,
                    host_memory_gbps=host_bw,
                    node=n,
                )
            )
    roles = {i.role for i in out}
    if ("prefill" in roles) != ("decode" in roles):
        raise top.fail(
            "nodes", "a PD split needs an instance with pd_type 'prefill' and one with 'decode'"
        )
    if "collocated" in roles and "prefill" in roles:
        raise top.fail("nodes", "mixing pd_type null instances with a PD split is not modelled")
    return ClusterSpec(tuple(out), link, None if lat is None else lat * 1e-9, doc)


def _ids(f: Fields, key: str, count: int) -> tuple[int, ...] | None:
    v = f.obj.get(key)
    if v is None:
        return None
    if not isinstance(v, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) for x in v
    ):
        raise f.fail(key, "expected a list of integer token ids")
    if len(v) != count:
        raise f.fail(key, f"has {len(v)} token ids, but the request says {count} tokens")
    return tuple(v)


def read_dataset(path: str | Path, *, need_ids: bool = False) -> list[DatasetRequest]:
    """The requests of a request file, in file order (module docstring)."""
    p = Path(path)
    gz = p.with_name(p.name + ".gz")
    try:
        if not p.is_file() and gz.is_file():  # a compressed copy stands in
            lines = gzip.decompress(gz.read_bytes()).decode().splitlines()
        else:
            lines = p.read_text().splitlines()
    except FileNotFoundError:
        raise ImportFileError(p, 0, None, "file is missing") from None
    except (UnicodeDecodeError, OSError, EOFError) as exc:
        raise ImportFileError(p, 1, None, f"cannot read it ({exc})") from None
    out: list[DatasetRequest] = []
    for i, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ImportFileError(p, i, None, f"not valid JSON ({exc.msg})") from None
        f = Fields(obj, p, i)
        t_in = f.integer("input_toks", required=True, minimum=1)
        t_out = f.integer("output_toks", required=True, minimum=1)
        arr = f.number("arrival_time_ns", required=True)
        assert t_in is not None and t_out is not None and arr is not None
        if arr < 0:
            raise f.fail("arrival_time_ns", f"must be >= 0, got {arr}")
        ids_in, ids_out = _ids(f, "input_tok_ids", t_in), _ids(f, "output_tok_ids", t_out)
        if need_ids and (ids_in is None or ids_out is None):
            raise f.fail(
                "input_tok_ids" if ids_in is None else "output_tok_ids",
                "missing: prefix caching replays the requests' token ids",
            )
        out.append(DatasetRequest(len(out), arr * 1e-9, t_in, t_out, ids_in, ids_out))
    if not out:
        raise ImportFileError(p, 1, None, "no requests")
    return out


def find_profile_dir(root: str | Path, hardware: str, model: str, tp: int) -> tuple[Path, int]:
    """(folder, TP it was measured at) of a model's profile under `root`: laid out
    `<GPU>/<org>/<model>/tp<N>` or `<org>/<model>/tp<N>`; the served TP's folder, else tp1
    (scaled to the served TP)."""
    r = Path(root)
    if not r.is_dir():
        raise ImportFileError(r, 0, None, "not a directory (expected <GPU>/<org>/<model>/tp<N>/)")
    bases = [r / hardware / model, r / model]
    for want in dict.fromkeys((tp, 1)):
        for base in bases:
            d = base / f"tp{want}"
            if has_file(d / "attention.csv"):
                return d, want
    raise ImportFileError(
        r, 0, None,
        f"no profile of {model} on {hardware} at TP {tp} (looked for "
        f"{bases[0] / f'tp{tp}'} and {bases[1] / f'tp{tp}'}, and their tp1)",
    )  # fmt: skip
