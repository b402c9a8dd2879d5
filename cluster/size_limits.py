"""Ceilings of every count and size a user can type or an imported file can claim.

A number that sizes what a command allocates (nodes, agents, DP ranks, KV blocks, layers,
bootstrap resamples, ...) is checked against its ceiling here before anything is built, so a
typo (`--agents 100000000`, `data_parallel_size: 1e9` in a meta.json) is a one-line
`ConfigError` naming the allowed range instead of gigabytes of memory and a kernel OOM kill.
Live settings of a running cluster (planner window, slices, copy price) have their ranges in
`cluster.control.bounds`; this table holds the sizes of runs, engines, models and inputs.

Why these ceilings: each is far above anything real (the largest run in docs/policies.md is 768
nodes and 30,720 agents; the largest served models have ~100 layers, 128 heads, a vocabulary
of ~260k and 256 routed experts; vLLM's defaults are 256-1,024 sequences and 8k-16k batched
tokens) and low enough that the largest allowed value allocates at most a few hundred MB.
Each is listed, with its reason, in docs/limits.md (a test checks the two agree).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from cluster.core import ConfigError


class Limit(NamedTuple):
    """An interval [lo, hi] (or (lo, hi] with `lo_open`) of a count or size; `integer`
    values must be whole; `why` says where the ceiling comes from (docs/limits.md)."""

    lo: float
    hi: float
    unit: str = ""
    integer: bool = True
    why: str = ""
    lo_open: bool = False

    def describe(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        kind = "an integer" if self.integer else "a number"
        left = "(" if self.lo_open else "["
        return f"{kind} in {left}{_num(self.lo)}, {_num(self.hi)}]{unit}"

    def check(self, name: str, value: object) -> None:
        """Raise ConfigError unless `value` is a finite number (integer if `integer`) within
        the interval; the message names `name`, the bound broken and what is allowed."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{name} must be {self.describe()}, got {value!r:.80}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{name} must be {self.describe()}, got {value}")
        if self.integer and not float(value).is_integer():
            raise ConfigError(f"{name} must be {self.describe()}, got {value:g}")
        shown = f"{value:g}" if isinstance(value, float) or abs(value) >= 1e15 else value
        if value < self.lo or (self.lo_open and value == self.lo):
            op = ">" if self.lo_open else ">="
            raise ConfigError(f"{name} must be {op} {_num(self.lo)}, got {shown}")
        if value > self.hi:
            unit = f" {self.unit}" if self.unit else ""
            why = f" ({self.why})" if self.why else ""
            raise ConfigError(f"{name} must be at most {_num(self.hi)}{unit}{why}, got {shown}")


def _num(x: float) -> str:
    if float(x).is_integer() and abs(x) < 1e15:
        return f"{int(x):,}"
    return f"{x:g}"


def check_agents(flag: str, agents: int | None, nodes: int) -> None:
    """Closed-loop agents: at most AGENTS in all and AGENTS_PER_NODE per node (an
    overloaded cluster queues every agent's request: memory grows with agents per node)."""
    if agents is None:
        return
    AGENTS.check(flag, agents)
    cap = int(AGENTS_PER_NODE.hi) * max(int(nodes), 1)
    if agents > cap:
        raise ConfigError(
            f"{flag} must be at most {AGENTS_PER_NODE.hi:,.0f} per node ({cap:,} for {nodes} "
            f"nodes; {AGENTS_PER_NODE.why}), got {agents}"
        )


def check(name: str, value: object, limit: Limit) -> None:
    """`limit.check(name, value)`; skips None (an option not given)."""
    if value is not None:
        limit.check(name, value)


TIB_IN_GIB = 1024
# ---- simulated clusters (pdlab simulate, sweep, serve, lab) --------------------------------
NODES = Limit(1, 4096, "nodes", why="the 3,072-GPU run is 768 nodes")
AGENTS = Limit(1, 100_000, "agents", why="30,720 in the largest run (768 nodes)")
AGENTS_PER_NODE = Limit(
    1, 1000, "agents per node", why="40 in the largest run; ~30 KB each when queued"
)
ARRIVAL_RATE_PER_MIN = Limit(0, 1e6, "programs/min", False, "16,667 programs/s", True)
MAX_ACTIVE = Limit(1, 1_000_000, "programs", why="open-loop admission queue")
MAX_PROGRAMS = Limit(1, 1_000_000_000, "programs", why="a stop condition, not an allocation")
SIM_SECONDS = Limit(0, 1e7, "simulated s", False, "~115 days; also warmup, learn, window")
KV_TOKENS = Limit(1, 1 << 40, "tokens", why="GPU or host KV tokens of one node")
GPU_MEMORY_GIB = Limit(0, 16 * TIB_IN_GIB, "GiB", False, "per GPU", True)
HOOK_BUDGET_S = Limit(0, 3600, "wall s", False, "one policy hook call", True)
DEFAULT_HOOK_BUDGET_S = 10.0  # its default (cluster.policies.guard), light for the CLI
PARTITIONS = Limit(1, 1024, "partitions", why="each is a process or a Ray task")
PROCESSES = Limit(1, 1024, "processes", why="worker processes of a sweep or partitions")
SWEEP_RUNS = Limit(1, 100_000, "runs", why="points x samples x seeds of one sweep")
SEEDS = Limit(1, 1000, "seeds", why="replicates of one configuration")
# ---- engines: TP/DP/EP, batch limits, KV blocks (engine settings, what-ifs, imports) ------
TENSOR_PARALLEL = Limit(1, 1024, "GPUs", why="GPUs of one engine")
DATA_PARALLEL = Limit(1, 4096, "ranks", why="one engine replayed per DP rank")
EXPERT_PARALLEL = Limit(1, 1024 * 4096, "GPUs", why="at most TP x DP")
MAX_NUM_SEQS = Limit(1, 65_536, "sequences", why="vLLM's defaults are 256-1,024")
BATCHED_TOKENS = Limit(1, 1 << 24, "tokens", why="per-iteration token budget")
BLOCK_SIZE = Limit(1, 65_536, "tokens", why="KV block (page) size")
KV_BLOCKS = Limit(1, 1 << 32, "blocks", why="KV blocks of one engine")
MODEL_LEN = Limit(1, 1 << 27, "tokens", why="context window (134M)")
GPU_MEMORY_BYTES = Limit(1, 16 * TIB_IN_GIB * (1 << 30), "bytes", why="per GPU")
CUDA_GRAPH_BATCH = Limit(0, 1 << 20, "sequences", why="largest captured batch")
# ---- model shapes (HF config.json, profile documents) ------------------------------------
LAYERS = Limit(1, 2048, "layers", why="the largest models have ~130")
HIDDEN_SIZE = Limit(1, 1 << 20, "")
HEADS = Limit(1, 1 << 16, "heads")
HEAD_DIM = Limit(1, 1 << 14, "")
INTERMEDIATE_SIZE = Limit(1, 1 << 22, "")
VOCAB_SIZE = Limit(1, 1 << 24, "tokens")
EXPERTS = Limit(0, 1 << 16, "experts", why="routed experts (0: dense)")
LATENT_DIM = Limit(0, 1 << 16, "", why="MLA kv_lora_rank and qk_rope_head_dim")
# ---- interconnect of profile imports and twins --------------------------------------------
LINK_GBPS = Limit(0, 1e12, "GB/s", False, "TP/EP collectives; 1e12 stands for a free link", True)
LINK_LATENCY_US = Limit(0, 1e6, "us", False, "one collective")
EXPERT_LOAD_SKEW = Limit(1, 1024, "x the mean", False, "busiest EP rank, at most EP")
# ---- imported requests (pdlab import) -----------------------------------------------------
REQUEST_TOKENS = Limit(0, 1 << 24, "tokens", why="input or output tokens of one request")
TIMESTAMP_S = Limit(0, 1e11, "s", False, "an epoch or monotonic clock reading (year 5138)")
RUN_SPAN_S = Limit(0, 1e7, "s", False, "first arrival to last token of an imported run")
# ---- fits and live engines ----------------------------------------------------------------
BOOTSTRAP = Limit(0, 100_000, "resamples", why="of a fit's confidence intervals")
SYNTH_ITERATIONS = Limit(0, 10_000_000, "iterations", why="per node of pdlab synth-logs")
PORT = Limit(0, 65_535, "", why="a TCP port (0: any free one)")
TOKEN_SCALE = Limit(0, 1000, "x", False, "torch engines: workload token counts", True)
TIME_SCALE = Limit(0, 1000, "x", False, "torch engines: tool gaps and arrivals", True)
OUTPUT_TOKENS = Limit(1, 1 << 20, "tokens", why="torch engines: a turn's output cap")
TORCH_NODES = Limit(1, 64, "engine processes", why="each loads a model")
UTILIZATION = Limit(0, 1, "", False, "a share of GPU memory", True)

LIMITS: dict[str, Limit] = {
    name: value for name, value in globals().items() if isinstance(value, Limit) and name.isupper()
}


def markdown_table() -> str:
    """The ceilings as the Markdown table of docs/limits.md (a test keeps the two equal)."""
    rows = ["| name | allowed | why |", "|---|---|---|"]
    for name, limit in LIMITS.items():
        allowed = limit.describe().replace("an integer in ", "integer ").replace("a number in ", "")
        rows.append(f"| `{name}` | {allowed} | {limit.why} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # python -m cluster.size_limits: the table of docs/limits.md
    print(markdown_table(), end="")
