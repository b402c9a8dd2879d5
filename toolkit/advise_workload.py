"""What `pdlab advise` reads from a recorded run: its requests as a replayable trace, its
node count and split, the profile and simulator settings, and the twin's measured error.

Any run with `requests` rows works: simulated, torch or SGLang clusters, imported vLLM or
SGLang benchmarks. The requests become a Mooncake-format trace (one JSON line per request:
`timestamp` in ms, `input_length`, `output_length`, `hash_ids`) that the cluster simulator
replays open-loop at the recorded arrivals (cluster.workloads.traces). Prefix structure,
where the run has it: the turns of one branch (`branch_id`) in arrival order extend each
other's context when turn k's input holds at least turn k-1's input and output; turn k
then shares turn k-1's full blocks of `block_tokens` tokens (equal `hash_ids`), and the
rest of its input is new. Imported benchmarks have one request per branch (no prefix
structure); forks share nothing here (their parent's prefix is not recorded per request).

The run's split: a simulated run's configured split when it had `nodes` nodes, moved by
its completed phase switches (so the split it ended on), else the prefill and decode nodes
its requests used when the two sets are disjoint; otherwise (collocated engines, mixed
use) None and no switch cost applies. `switched` says whether the run changed its split.

The twin's error: the latest run of source 'twin' made of this run (`pdlab twin` stores
one, config "twin_of") gives, per metric, sim / real - 1 on the requests both hold.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from cluster.core import ConfigError
from cluster.sim.config import parse_split
from toolkit.queries.run import Run, open_run
from toolkit.twin_metrics import Timings, compare

TRACE_BLOCK_TOKENS = 256  # granularity of the shared prefix in the trace (tokens per hash)
# Simulator settings a simulated run's config carries over to the replays.
CARRIED = ("router", "eviction", "kv_fetch", "l1_tokens", "l2_tokens", "relaunch_s", "window_s")
# The switch mode of each planner (cluster/control/planning.py).
PLANNER_MODES = {"gain": "in-place", "static": "in-place", "dynamo": "relaunch", "arrow": "strand"}


class RecordedRun(NamedTuple):
    """One recorded run as `pdlab advise` needs it."""

    run_id: str
    source: str
    num_nodes: int
    split: tuple[int, int] | None  # (prefill, decode) nodes of the run, None if not PD
    switched: bool  # the run switched phases: `split` is where it ended
    profile: str | None  # the run's profile (simulated runs), else None
    settings: dict[str, Any]  # simulator settings carried over (CARRIED)
    planner: str | None
    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    hash_ids: list[list[int]]
    real: Timings | None  # recorded times of finished requests (for the recorded row)
    twin_run_id: str | None
    twin_error: dict[str, float]  # metric -> sim / real - 1 of the twin, empty if none


def load_run(db: str | Path, run_id: str | None) -> RecordedRun:
    """Read the run (TelemetryError for a bad database or run, ConfigError for a run that
    cannot be replayed)."""
    with open_run(db, run_id) as run:
        cfg = run.config()
        if cfg.get("arrivals") == "unknown":
            raise ConfigError(
                f"run {run.run_id!r} did not record when its requests arrived: a replay "
                "needs the arrivals"
            )
        df = run.df(
            "SELECT request_id, branch_id, t_arrival, t_in, t_out, prefill_node, decode_node, "
            "t_first_token, t_done FROM requests WHERE run_id = ? AND t_in > 0 "
            "ORDER BY t_arrival, request_id",
            [run.run_id],
        )
        if df.height == 0:
            raise ConfigError(
                f"run {run.run_id!r} has no requests with input tokens to replay (the "
                "`requests` table is empty for it)"
            )
        source = str(run.scalar("SELECT source FROM runs WHERE run_id = ?", [run.run_id]) or "")
        num_nodes = int(run.count("nodes")) or _nodes_used(df)
        twin_id, twin_error = _twin_error(run, df)
        moves = run.rows(
            "SELECT from_phase, to_phase FROM phase_switches WHERE run_id = ? "
            "AND t_done IS NOT NULL",
            [run.run_id],
        )
        split = _split(cfg, num_nodes, df, moves)
        settings = {k: cfg[k] for k in CARRIED if cfg.get(k) is not None}
        profile = cfg.get("profile") if isinstance(cfg.get("profile"), str) else None
        planner = cfg.get("planner") if isinstance(cfg.get("planner"), str) else None
        real_id = run.run_id
    done = df["t_first_token"].is_not_null() & df["t_done"].is_not_null()
    fin = df.filter(done)
    real = (
        Timings(*(fin[c].to_numpy().astype(float) for c in _TIMING_COLUMNS)) if fin.height else None
    )
    return RecordedRun(
        real_id,
        source,
        num_nodes,
        split,
        bool(moves),
        profile,
        settings,
        planner,
        df["t_arrival"].to_numpy().astype(float),
        df["t_in"].to_numpy().astype(np.int64),
        np.maximum(df["t_out"].to_numpy().astype(np.int64), 1),
        prefix_hashes(df["branch_id"].to_list(), df["t_in"].to_list(), df["t_out"].to_list()),
        real,
        twin_id,
        twin_error,
    )


_TIMING_COLUMNS = ("t_arrival", "t_out", "t_first_token", "t_done")


def _nodes_used(df: Any) -> int:
    used = set(df["prefill_node"].drop_nulls().to_list()) | set(
        df["decode_node"].drop_nulls().to_list()
    )
    return len(used)


def _split(
    cfg: dict[str, Any], num_nodes: int, df: Any, moves: list[tuple[Any, ...]]
) -> tuple[int, int] | None:
    """The run's PD split (module docstring), None when it was not one."""
    split, nodes = cfg.get("split"), cfg.get("nodes")
    if isinstance(split, str) and nodes == num_nodes:
        try:
            p, d = parse_split(split, num_nodes) or (0, 0)
        except ConfigError:
            return None
        for from_phase, to_phase in moves:
            p += (to_phase == "prefill") - (from_phase == "prefill")
            d += (to_phase == "decode") - (from_phase == "decode")
        return (p, d) if p >= 1 and d >= 1 else None
    prefill = set(df["prefill_node"].drop_nulls().to_list())
    decode = set(df["decode_node"].drop_nulls().to_list())
    if prefill and decode and not prefill & decode and len(prefill | decode) == num_nodes:
        return len(prefill), len(decode)
    return None


def prefix_hashes(
    branches: list[Any], inputs: list[int], outputs: list[int], block_tokens: int = 0
) -> list[list[int]]:
    """Per request (in the given arrival order), its blocks' ids (module docstring)."""
    bt = block_tokens or TRACE_BLOCK_TOKENS
    last: dict[Any, tuple[list[int], int, int]] = {}  # branch -> (ids, input, output)
    next_id = 0
    out: list[list[int]] = []
    for branch, t_in, t_out in zip(branches, inputs, outputs, strict=True):
        ids: list[int] = []
        prev = last.get(branch)
        if prev is not None and t_in >= prev[1] + prev[2]:
            ids = prev[0][: prev[1] // bt]  # the previous turn's full input blocks
        need = -(-int(t_in) // bt)
        while len(ids) < need:
            ids = [*ids, next_id]
            next_id += 1
        last[branch] = (ids, int(t_in), int(t_out))
        out.append(ids)
    return out


def write_trace(rec: RecordedRun, path: Path) -> Path:
    """The run's requests as a Mooncake-format trace at `path` (module docstring)."""
    with path.open("w") as f:
        for t, t_in, t_out, ids in zip(
            rec.arrival_s, rec.input_tokens, rec.output_tokens, rec.hash_ids, strict=True
        ):
            f.write(
                json.dumps(
                    {
                        "timestamp": float(t) * 1000.0,
                        "input_length": int(t_in),
                        "output_length": int(t_out),
                        "hash_ids": ids,
                    }
                )
                + "\n"
            )
    return path


def _twin_error(run: Run, df: Any) -> tuple[str | None, dict[str, float]]:
    """The latest twin of the run and its error per metric (module docstring)."""
    rows = run.rows(
        "SELECT run_id, config FROM runs WHERE source = 'twin' ORDER BY started_at DESC, run_id"
    )
    for twin_id, raw in rows:
        try:
            cfg = json.loads(raw) if raw else {}
        except (TypeError, ValueError):
            continue
        if not isinstance(cfg, dict) or cfg.get("twin_of") != run.run_id:
            continue
        sim = run.df(
            "SELECT request_id, t_first_token AS sim_first, t_done AS sim_done FROM requests "
            "WHERE run_id = ? AND t_first_token IS NOT NULL AND t_done IS NOT NULL",
            [twin_id],
        )
        both = df.join(sim, on="request_id")
        both = both.filter(both["t_first_token"].is_not_null() & both["t_done"].is_not_null())
        if both.height == 0:
            continue
        arr, t_out = both["t_arrival"].to_numpy(), both["t_out"].to_numpy().astype(float)
        real = Timings(arr, t_out, both["t_first_token"].to_numpy(), both["t_done"].to_numpy())
        sim_t = Timings(arr, t_out, both["sim_first"].to_numpy(), both["sim_done"].to_numpy())
        metrics = compare(real, sim_t, samples=10)
        return str(twin_id), {k: m.error for k, m in metrics.items()}
    return None, {}
