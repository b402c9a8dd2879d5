"""What a run holds, and which report figures that supports (SPEC §7 `pdlab report`).

A run can be requests only (an imported benchmark: `pdlab import vllm-bench`, `lss-bench`,
`sglang-bench`), a cluster with iteration logs (the simulator, live clusters, `pdlab
attach`), a PD cluster (nodes in prefill and decode phases, switches, a planner), an MoE
model's, a twin replay. `run_content` counts what each figure needs in a few cheap queries;
`select_figures` keeps the figures the run can fill, in the report's order, and says in one
line what is left out and why, instead of drawing a figure that only says "no … logged".
"""

from __future__ import annotations

from typing import NamedTuple

from toolkit.queries.run import Run
from toolkit.queries.split import phase_segments

# The report's order (names of toolkit.plots.FIGURES, checked by a test).
ORDER = (
    "split",
    "latency",
    "queue",
    "timeline",
    "reuse",
    "load",
    "planner",
    "prefill_fit",
    "decode_fit",
    "phi",
    "eviction",
    "counts",
    "count_tree",
)


class RunContent(NamedTuple):
    run_id: str
    source: str | None
    importer: str | None  # the run config's "importer" (imported runs)
    nodes: int
    requests: int  # finished requests
    scheduled: int  # of them, with a prefill start (schedule) time
    prefill_passes: int
    decode_passes: int
    phases: frozenset[str]  # phases the nodes served (prefill, decode, collocated, switching)
    switches: int
    planner_windows: int
    moe: bool  # some node's model has routed experts (moe_experts > 0)
    cached_tokens: bool  # some request logged cached or ideal-cache tokens
    evictions: int
    branch_counts: int
    recorded_series: bool  # running/waiting counts recorded by the engines

    @property
    def passes(self) -> int:
        return self.prefill_passes + self.decode_passes

    @property
    def pd(self) -> bool:
        """A PD cluster: some node served prefill or decode alone, or switched phase."""
        return bool(self.phases & {"prefill", "decode", "switching"}) or self.switches > 0


class Selection(NamedTuple):
    names: list[str]  # figures to draw, in ORDER
    absent: list[str]  # one phrase per group of figures left out: what and why

    def note(self) -> str | None:
        """The one line the report shows (None when nothing is left out)."""
        return "Not shown: " + "; ".join(self.absent) + "." if self.absent else None


def _count(run: Run, table: str, where: str = "true") -> int:
    return run.count(table, where)


def run_content(run: Run) -> RunContent:
    """What the run logged, counted per table (see module docstring)."""
    rid = run.run_id
    req = run.rows(
        "SELECT count(*), count(t_prefill_start), "
        "coalesce(sum(t_c), 0) > 0 OR count(t_ideal_c) > 0 "
        "FROM requests WHERE run_id = ? AND t_done IS NOT NULL",
        [rid],
    )[0]
    nodes = run.nodes()
    moe = bool(nodes.height and (nodes["moe_experts"].fill_null(0) > 0).any())
    segments = phase_segments(run)
    phases = frozenset(s.phase for s in segments.segments) - {"unknown"}
    series = run.scalar(
        "SELECT (SELECT count(*) FROM reference_series WHERE run_id = ? AND source = 'real' "
        "AND metric IN ('running_reqs', 'waiting_reqs')) + (SELECT count(*) FROM engine_metrics "
        "WHERE run_id = ? AND metric IN ('vllm:num_requests_running', "
        "'sglang:num_running_reqs'))",
        [rid, rid],
    )
    return RunContent(
        run_id=rid,
        source=run.scalar("SELECT source FROM runs WHERE run_id = ? LIMIT 1", [rid]),
        importer=run.config().get("importer"),
        nodes=nodes.height,
        requests=int(req[0]),
        scheduled=int(req[1]),
        prefill_passes=_count(run, "prefill_iterations"),
        decode_passes=_count(run, "decode_iterations"),
        phases=phases,
        switches=segments.switches.height,
        planner_windows=_count(run, "planner_windows"),
        moe=moe,
        cached_tokens=bool(req[2]),
        evictions=_count(run, "evictions"),
        branch_counts=_count(run, "branch_counts"),
        recorded_series=bool(series),
    )


def select_figures(c: RunContent) -> Selection:
    """The figures `c` can fill, and what is left out and why (module docstring)."""
    keep: set[str] = set()
    absent: list[str] = []
    origin = f"imported by {c.importer}" if c.importer else f"source {c.source}"
    if c.requests:
        keep.add("latency")
    else:
        absent.append("latency distributions (no finished requests logged)")
    if c.recorded_series or c.requests:
        keep.add("queue")
    if c.passes:
        keep |= {"timeline", "load"}
        keep |= {"prefill_fit"} if c.prefill_passes else set()
        keep |= {"decode_fit"} if c.decode_passes else set()
        if not (c.prefill_passes and c.decode_passes):
            which = "decode" if c.prefill_passes else "prefill"
            absent.append(f"{which} iteration-time fit (no {which} passes logged)")
    else:
        absent.append(
            "pass timeline, load balance and iteration-time fits (no prefill or decode passes "
            f"logged: a request-only run, {origin})"
        )
        if c.nodes > 1 and c.scheduled:
            keep.add("load")  # queue waits per engine still compare the engines
    if c.pd:
        keep.add("split")
    else:
        n = "one engine" if c.nodes <= 1 else f"{c.nodes} engines"
        absent.append(f"PD split over time ({n}, no prefill/decode roles or switches logged)")
    if c.planner_windows:
        keep.add("planner")
    elif c.pd:
        absent.append("planner gain test (no planner windows: a static split)")
    if c.moe and c.decode_passes:
        keep.add("phi")
    elif c.moe:
        absent.append("expert coverage φ(B) (MoE model, but no decode passes logged)")
    else:
        absent.append("expert coverage φ(B) (a dense model: φ = 0)")
    if c.cached_tokens:
        keep.add("reuse")
    elif c.requests:
        absent.append("KV reuse (no cached or ideal-cache tokens logged)")
    if c.evictions:
        keep.add("eviction")
    if c.branch_counts:
        keep |= {"counts", "count_tree"}
    if not (c.evictions or c.branch_counts):
        absent.append("KV eviction and branch counts (no evictions or branch counts logged)")
    return Selection([n for n in ORDER if n in keep], absent)
