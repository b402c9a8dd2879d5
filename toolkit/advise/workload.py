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

The twin's error: a run of source 'twin' made of this run (`pdlab twin` stores one, config
"twin_of") gives, per metric, sim / real - 1 and the 95% interval of that error it stored
(a twin stored before intervals were: +-|error|). Which twin: the one named (`twin`), else
the latest made with the same profile as the replays (`profile`, compared as resolved
paths; with none, the replays use the run's own profile and so does a twin of a cluster
run, priced by the run's own fits); never a twin of another profile, and never one made
with `pdlab twin --force` (its profile describes another model or GPU: its error says
nothing about this one). A run with twins none of which qualifies gets a note naming them
(`twin_note`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from cluster.core import ConfigError, parse_split
from toolkit.queries.run import Run, open_run
from toolkit.twin.metrics import Timings, compare

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
    # metric -> 95% interval of the twin's error (stored by `pdlab twin`, else +-|error|)
    twin_interval: dict[str, tuple[float, float]] | None = None
    twin_profile: str | None = None
    twin_note: str | None = None  # twins of the run that were not used, and why


def load_run(
    db: str | Path, run_id: str | None, *, twin: str | None = None, profile: str | None = None
) -> RecordedRun:
    """Read the run (TelemetryError for a bad database or run, ConfigError for a run that
    cannot be replayed, or a `twin` that is not a usable twin of it)."""
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
        tw = _twin(run, df, twin, profile)
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
        tw.run_id,
        tw.error,
        tw.interval,
        tw.profile,
        tw.note,
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


class TwinInfo(NamedTuple):
    run_id: str | None
    error: dict[str, float]
    interval: dict[str, tuple[float, float]] | None
    profile: str | None
    note: str | None


def _same_profile(a: Any, b: str | None) -> bool:
    if not isinstance(a, str) or b is None:
        return False
    try:
        return a == b or Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


def _twin(run: Run, df: Any, wanted: str | None, profile: str | None) -> TwinInfo:
    """The twin to use and its error (module docstring)."""
    rows = run.rows(
        "SELECT run_id, config FROM runs WHERE source = 'twin' ORDER BY started_at DESC, run_id"
    )
    twins = []
    for twin_id, raw in rows:
        try:
            cfg = json.loads(raw) if raw else {}
        except (TypeError, ValueError):
            continue
        if isinstance(cfg, dict) and cfg.get("twin_of") == run.run_id:
            twins.append((str(twin_id), cfg))
    none = TwinInfo(None, {}, None, None, None)
    if wanted is not None:
        match = [t for t in twins if t[0] == wanted]
        if not match:
            raise ConfigError(
                f"--twin {wanted!r} is not a twin of run {run.run_id!r}; its twins: "
                f"{', '.join(t for t, _ in twins) or 'none (make one with `pdlab twin`)'}"
            )
        chosen = match[0]
        if chosen[1].get("forced"):
            raise ConfigError(
                f"twin {wanted!r} was made with --force on a profile of another model or GPU "
                f"({chosen[1].get('profile')}): its error says nothing about this run; make a "
                "twin with a matching profile"
            )
    else:
        usable = [t for t in twins if not t[1].get("forced")]
        # No --profile: the replays use the run's own; so does a cluster twin (its own fits).
        same = [
            t
            for t in usable
            if _same_profile(t[1].get("profile"), profile)
            or (profile is None and t[1].get("kind") == "cluster")
        ]
        if not same:
            if not twins:
                return none
            names = ", ".join(
                f"{t} ({'FORCED, ' if c.get('forced') else ''}profile {c.get('profile') or '-'})"
                for t, c in twins
            )
            hint = "; pass --twin RUN to use one" if usable else ""
            return none._replace(
                note=f"not used: twins of this run made with another profile or forced: "
                f"{names}{hint}"
            )
        chosen = same[0]
    twin_id, cfg = chosen
    error, interval = _twin_metrics(run, df, twin_id, cfg)
    if not error:
        return none._replace(note=f"twin {twin_id} shares no finished request with the run")
    return TwinInfo(twin_id, error, interval, cfg.get("profile"), None)


def _twin_metrics(
    run: Run, df: Any, twin_id: str, cfg: dict[str, Any]
) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """Per metric the twin's error and its 95% interval: as stored, else +-|error|."""
    stored = cfg.get("metrics")
    if isinstance(stored, dict) and stored:
        err = {k: float(v["error"]) for k, v in stored.items() if v.get("error") is not None}
        ci = {}
        for k, v in stored.items():
            lo, hi = (v.get("ci95") or [None, None])[:2]
            if k in err and lo is not None and hi is not None:
                ci[k] = (min(float(lo), -abs(err[k])), max(float(hi), abs(err[k])))
        return err, ci
    sim = run.df(
        "SELECT request_id, t_first_token AS sim_first, t_done AS sim_done FROM requests "
        "WHERE run_id = ? AND t_first_token IS NOT NULL AND t_done IS NOT NULL",
        [twin_id],
    )
    both = df.join(sim, on="request_id")
    both = both.filter(both["t_first_token"].is_not_null() & both["t_done"].is_not_null())
    if both.height == 0:
        return {}, {}
    arr, t_out = both["t_arrival"].to_numpy(), both["t_out"].to_numpy().astype(float)
    real = Timings(arr, t_out, both["t_first_token"].to_numpy(), both["t_done"].to_numpy())
    sim_t = Timings(arr, t_out, both["sim_first"].to_numpy(), both["sim_done"].to_numpy())
    metrics = compare(real, sim_t, samples=10)
    err = {k: m.error for k, m in metrics.items()}
    return err, {k: (-abs(e), abs(e)) for k, e in err.items()}
