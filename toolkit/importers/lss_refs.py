"""Reference series and latency tables of a real run (`pdlab import lss-run`).

Tab-separated files, as LLMServingSim's artifact keeps them:
- throughput: `time_s`, `throughput` (output tokens per 1 s tick);
- prefix: `time_s`, `gpu_mem_mb`, `prefix_hit_pct` of one instance, or `time_s`,
  `shared_cpu_mem_mb`, `shared_cpu_prefix_hit_pct` of a shared CPU pool (told apart by
  their columns; instances' files in the config's order);
- latency: `framework`, `throughput_tok_s`, `mean_ttft_ms`, `mean_tpot_ms` (and optionally
  `mean_e2e_ms`): the `vLLM` row is the real run, the others simulators' figures for it;
  `X` or empty = not given.
A series of a peer simulator of the same run is found beside a reference file: the same
file name in a sibling `llmservingsim/` or `parsed/` folder (the artifact's layouts).
Errors name the file, line and column.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from toolkit.importers.fields import ImportFileError

PEER_FOLDERS = {"llmservingsim": "LLMServingSim", "parsed": "LLMServingSim"}
MISSING = ("", "x", "X", "-", "nan", "NaN")
SERIES_METRICS = {
    "throughput": ("cluster", "throughput_tok_s"),
    "gpu_mem_mb": ("instance", "gpu_mem_mb"),
    "prefix_hit_pct": ("instance", "prefix_hit_pct"),
    "shared_cpu_mem_mb": ("pool", "cpu_mem_mb"),
    "shared_cpu_prefix_hit_pct": ("pool", "cpu_prefix_hit_pct"),
}


@dataclass(frozen=True, slots=True)
class SeriesRow:
    source: str
    scope: str
    node_id: int | None
    metric: str
    t: float
    value: float


@dataclass(frozen=True, slots=True)
class LatencyRow:
    framework: str
    is_real: bool
    throughput_tok_s: float | None
    ttft_mean_s: float | None
    tpot_mean_s: float | None
    e2e_mean_s: float | None


def _table(path: Path) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    try:
        f = path.open(newline="")
    except FileNotFoundError:
        raise ImportFileError(path, 0, None, "file is missing") from None
    with f:
        reader = csv.DictReader(f, delimiter="\t")
        header = [h.strip() for h in reader.fieldnames or ()]
        reader.fieldnames = header
        rows = [(reader.line_num, row) for row in reader]
    return header, rows


def _value(path: Path, line: int, col: str, text: str | None, *, optional: bool) -> float | None:
    t = (text or "").strip()
    if t in MISSING:
        if optional:
            return None
        raise ImportFileError(path, line, col, f"missing value {text!r}")
    try:
        v = float(t)
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or v < 0:
        raise ImportFileError(path, line, col, f"expected a finite number >= 0, got {text!r}")
    return v


def series_kind(path: Path) -> str:
    """'throughput', 'instance' or 'pool': what a series file holds, by its columns."""
    header, _ = _table(path)
    if "throughput" in header:
        return "throughput"
    if "shared_cpu_mem_mb" in header or "shared_cpu_prefix_hit_pct" in header:
        return "pool"
    if "gpu_mem_mb" in header or "prefix_hit_pct" in header:
        return "instance"
    raise ImportFileError(
        path, 1, None,
        f"columns {', '.join(header) or 'none'}: expected time_s with throughput, or "
        "gpu_mem_mb/prefix_hit_pct, or shared_cpu_mem_mb/shared_cpu_prefix_hit_pct",
    )  # fmt: skip


def read_series(
    path: str | Path, source: str, node_id: int | None, *, optional_values: bool = False
) -> list[SeriesRow]:
    """Rows of one series file (module docstring); empty cells are skipped in a peer's."""
    p = Path(path)
    header, rows = _table(p)
    if "time_s" not in header:
        raise ImportFileError(p, 1, "time_s", "missing column (the tick, seconds)")
    cols = [c for c in header if c in SERIES_METRICS]
    if not cols:
        series_kind(p)  # raises, naming the columns
    out: list[SeriesRow] = []
    seen: set[float] = set()
    for line, row in rows:
        t = _value(p, line, "time_s", row.get("time_s"), optional=False)
        assert t is not None
        if t in seen:
            raise ImportFileError(p, line, "time_s", f"tick {t:g} repeats")
        seen.add(t)
        for c in cols:
            v = _value(p, line, c, row.get(c), optional=optional_values)
            if v is None:
                continue
            scope, metric = SERIES_METRICS[c]
            out.append(
                SeriesRow(source, scope, node_id if scope == "instance" else None, metric, t, v)
            )
    if not out:
        raise ImportFileError(p, 2, None, "no rows")
    return out


def peer_files(path: str | Path) -> dict[str, Path]:
    """{peer name: file} of peers' series of the same run beside a reference file."""
    p = Path(path)
    out: dict[str, Path] = {}
    for folder, peer in PEER_FOLDERS.items():
        cand = p.parent.parent / folder / p.name
        if cand.is_file() and cand.resolve() != p.resolve() and peer not in out:
            out[peer] = cand
    return out


def read_latency(path: str | Path) -> list[LatencyRow]:
    """The rows of a latency table; exactly one `vLLM` row (the real run)."""
    p = Path(path)
    header, rows = _table(p)
    need = ("framework", "throughput_tok_s", "mean_ttft_ms", "mean_tpot_ms")
    missing = [c for c in need if c not in header]
    if missing:
        raise ImportFileError(
            p, 1, missing[0], f"missing column (need {', '.join(need)}; got {', '.join(header)})"
        )
    out: list[LatencyRow] = []
    for line, row in rows:
        name = (row.get("framework") or "").strip()
        if not name:
            raise ImportFileError(p, line, "framework", "empty")
        if any(r.framework == name for r in out):
            raise ImportFileError(p, line, "framework", f"{name!r} repeats")

        def ms(col: str, line: int = line, row: dict[str, str] = row) -> float | None:
            v = _value(p, line, col, row.get(col), optional=True)
            return None if v is None else v / 1e3

        out.append(
            LatencyRow(
                name, name.lower() == "vllm",
                _value(p, line, "throughput_tok_s", row.get("throughput_tok_s"), optional=True),
                ms("mean_ttft_ms"), ms("mean_tpot_ms"),
                ms("mean_e2e_ms") if "mean_e2e_ms" in header else None,
            )
        )  # fmt: skip
    real = [r for r in out if r.is_real]
    if len(real) != 1:
        raise ImportFileError(
            p, 1, "framework", f"needs exactly one 'vLLM' row (the real run), found {len(real)}"
        )
    return out
