"""The engine's recorded series of an LLMServingSim bench run (`timeseries.csv`).

The bench's vLLM stat logger (`bench/core/stat_logger.py`) records vLLM's SchedulerStats and
IterationStats at every scheduler step and writes them downsampled to `tick_seconds` (1 s by
default): per tick `t` (the tick's end, s), `prompt_throughput` and `gen_throughput`
(tokens/s over the tick, summed over DP engines), `running` and `waiting` (the requests of
each engine's last step in the tick, summed over engines) and `kv_cache_pct` (GPU KV blocks
in use, %, mean over engines); newer files add `prompt_compute_throughput`,
`prompt_cached_throughput` and `preempted` (requests preempted in the tick).

They become `reference_series` rows (source 'real', scope 'cluster'). The logger's clock
starts when it does, which the recorded files place at the first arrival to within a tick
(its running and waiting counts agree best with those rebuilt from the requests' engine
timestamps at offset 0: compare them to ±1 tick). A file that is missing is no error (the
run has no series); a malformed one is, naming the line and column. The file is read bounded
like every input (cluster.input_files: regular file, size cap, UTF-8 without NUL), and a
tick's time is a duration inside the run (at most MAX_SPAN_S).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from cluster.input_files import InputFileError, iter_lines
from toolkit.importers.fields import MAX_SPAN_S, ImportFileError, _as_import_error

# reference_series metric <- timeseries.csv column (in the order they are stored)
COLUMNS = {
    "running_reqs": "running",
    "waiting_reqs": "waiting",
    "kv_cache_pct": "kv_cache_pct",
    "throughput_tok_s": "gen_throughput",
    "prompt_throughput_tok_s": "prompt_throughput",
    "preempted_reqs": "preempted",
}
REQUIRED = ("t", "running", "waiting")


def read_series(path: Path) -> tuple[dict[str, list[Any]] | None, dict[str, Any] | None]:
    """(reference_series columns, what the config says of them), or (None, None) without
    the file."""
    if not path.is_file():
        return None, None
    out: dict[str, list[Any]] = {k: [] for k in ("source", "scope", "node_id", "metric")}
    out |= {"t": [], "value": []}
    ticks = 0
    try:
        reader = csv.DictReader(iter_lines(path, what="series CSV"))
        header = list(reader.fieldnames or [])
        absent = [c for c in REQUIRED if c not in header]
        if absent:
            raise ImportFileError(path, 1, absent[0], f"column missing (header: {header})")
        cols = [(m, c) for m, c in COLUMNS.items() if c in header]
        for row in reader:
            line = reader.line_num
            t = _number(path, line, "t", row.get("t"))
            if t > MAX_SPAN_S:
                raise ImportFileError(
                    path, line, "t", f"expected at most {MAX_SPAN_S:g} s, got {t:g}"
                )
            for metric, col in cols:
                out["metric"].append(metric)
                out["t"].append(t)
                out["value"].append(_number(path, line, col, row.get(col)))
            ticks += 1
    except InputFileError as exc:
        raise _as_import_error(exc) from None
    except csv.Error as exc:
        raise ImportFileError(path, reader.line_num, None, f"not valid CSV ({exc})") from None
    n = len(out["t"])
    out["source"], out["scope"], out["node_id"] = ["real"] * n, ["cluster"] * n, [None] * n
    info = {
        "file": path.name,
        "ticks": ticks,
        "metrics": [m for m, _ in cols],
        "clock": "tick ends since the stat logger's start (= first arrival within a tick)",
    }
    return out, info


def _number(path: Path, line: int, col: str, text: str | None) -> float:
    try:
        value = float(text) if text not in (None, "") else math.nan
    except ValueError:
        raise ImportFileError(path, line, col, f"not a number: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ImportFileError(path, line, col, f"expected a finite number >= 0, got {text!r}")
    return value
