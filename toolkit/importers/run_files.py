"""Which recorded runs a path holds, for `pdlab import vllm-bench PATH` (SPEC §9).

A file is one vLLM benchmark result (`vllm_result`); a directory with `meta.json` and
`requests.jsonl` is one LLMServingSim bench run (`vllm_bench`); any other directory is
searched (recursively, in name order) for both, so a directory of runs imports each run it
finds. JSON files that are not vLLM results are listed as skipped, with the reason.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal, NamedTuple

from toolkit.importers.vllm_result import is_vllm_result

Kind = Literal["vllm-result", "lss-bench"]
MAX_SCAN_BYTES = 256 << 20  # a result file larger than this is not read while searching


class FoundRun(NamedTuple):
    kind: Kind
    path: Path


def is_lss_dir(path: Path) -> bool:
    return (path / "meta.json").is_file() and (path / "requests.jsonl").is_file()


def find_runs(path: str | Path) -> tuple[list[FoundRun], list[tuple[Path, str]]]:
    """(runs found, (skipped file, why)) under `path` (module docstring)."""
    p = Path(path)
    if p.is_file():
        return [FoundRun("vllm-result", p)], []
    if is_lss_dir(p) or any(os.path.lexists(p / n) for n in ("meta.json", "requests.jsonl")):
        # the layout given directly, even broken: its importer names what is wrong with it
        return [FoundRun("lss-bench", p)], []
    found: list[FoundRun] = []
    skipped: list[tuple[Path, str]] = []
    for d in sorted([p, *(q for q in p.rglob("*") if q.is_dir())]):
        if d != p and is_lss_dir(d):
            found.append(FoundRun("lss-bench", d))
            continue
        if any(is_lss_dir(a) for a in d.parents if p in (a, *a.parents)):
            continue  # inside a run directory already found
        for f in sorted(d.glob("*.json")):
            if f.name in ("meta.json", "cluster_config.json"):
                continue
            why = _not_a_result(f)
            if why is None:
                found.append(FoundRun("vllm-result", f))
            else:
                skipped.append((f, why))
    return found, skipped


def _not_a_result(f: Path) -> str | None:
    if f.stat().st_size > MAX_SCAN_BYTES:
        return f"larger than {MAX_SCAN_BYTES >> 20} MiB"
    try:
        text = f.read_text()
        doc = json.loads(text.splitlines()[0] if text.lstrip().startswith("{") and "\n{" in text
                         else text)  # fmt: skip
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, IndexError):
        return "not JSON"
    return None if is_vllm_result(doc) else "not a vLLM result (no model_id, date and totals)"
