"""The simulator's modules form one-way layers: each imports only modules below it.

Lower layers signal upward through callbacks the composition root (`simulator.py`) wires,
never by importing what is above them. Imports under `if TYPE_CHECKING:` are exempt.
"""

from __future__ import annotations

import ast
from pathlib import Path

SIM = Path(__file__).resolve().parents[3] / "cluster" / "sim"

# Lowest first. `runner` (a run into a database) and `paced` (the simulated cluster paced
# to wall-clock time) sit on the simulator's public face.
LAYERS = (
    "__init__",
    "fields",
    "resolved",
    "config",
    "buffer",
    "kernel",
    "entities",
    "metrics",
    "warmup",
    "memory",
    "tiered_memory",
    "unified_memory",
    "node",
    "stage",
    "prefill",
    "decode_batch",
    "decode",
    "mixed",
    "node_engine",
    "contexts",
    "planes",
    "orchestrator",
    "drain",
    "simulator",
    "runner",
    "paced",
    "ray_runtime",
    "partitions",
    "bench",
)


def _sim_imports(path: Path) -> set[str]:
    """cluster.sim modules imported by `path` outside `if TYPE_CHECKING:`."""
    found: set[str] = set()
    stack: list[ast.AST] = [ast.parse(path.read_text())]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[:2] == ["cluster", "sim"] and len(parts) > 2 and parts[2] in LAYERS:
                found.add(parts[2])
        stack.extend(ast.iter_child_nodes(node))
    return found


def test_every_simulator_module_has_a_layer():
    modules = {p.stem for p in SIM.glob("*.py")}
    assert not modules - set(LAYERS), (
        f"add to LAYERS (and the docstring of simulator.py): {modules - set(LAYERS)}"
    )


def test_simulator_modules_import_only_lower_layers():
    rank = {m: i for i, m in enumerate(LAYERS)}
    upward = []
    for path in sorted(SIM.glob("*.py")):
        for dep in sorted(_sim_imports(path)):
            if dep != path.stem and rank[dep] > rank[path.stem]:
                upward.append(f"{path.stem} imports {dep}")
    assert not upward, "\n".join(upward)


def test_metrics_read_a_plain_record_not_the_simulator():
    assert "simulator" not in (SIM / "metrics.py").read_text().replace("simulator builds", "")
