"""The layering rules of ARCHITECTURE.md, checked from the source tree (ast, no imports run).

Every `import` counts, including those inside functions (a lazy import is still a
dependency); only imports under `if TYPE_CHECKING:` are exempt, since they never run.
"""

from __future__ import annotations

import ast
from collections.abc import Container, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("models", "telemetry", "cluster", "toolkit")
MAX_LINES = 500

# Which of our packages each package may import (besides itself). The top-level packages
# follow SPEC §1 (models and telemetry depend on nothing of ours, cluster uses both, toolkit
# uses all); inside `cluster` the layers run core -> kv, workloads -> control -> policies ->
# sim -> sweep -> experiments, with the server and the SGLang adapter beside the simulator,
# never importing it or each other (the CLI wires them together).
BASE = ("cluster.core", "cluster.input_files", "cluster.size_limits")
ALLOWED: dict[str, tuple[str, ...]] = {
    "models": (),
    "telemetry": (),
    "toolkit": ("models", "telemetry", "cluster"),
    "cluster.core": (),
    "cluster.input_files": ("cluster.core",),
    "cluster.size_limits": ("cluster.core",),
    "cluster.kv": ("models", *BASE),
    "cluster.hardware": ("models", *BASE),
    "cluster.workloads": ("models", *BASE),
    "cluster.control": ("models", *BASE, "cluster.hardware", "cluster.kv"),
    "cluster.policies": ("models", *BASE, "cluster.kv", "cluster.hardware", "cluster.control"),
    "cluster.sim": (
        "models", "telemetry", *BASE, "cluster.kv", "cluster.hardware", "cluster.workloads",
        "cluster.control",
        "cluster.policies",
    ),
    "cluster.server": (
        "models", "telemetry", *BASE, "cluster.kv", "cluster.hardware", "cluster.control",
    ),
    "cluster.sglang.wire": ("models", *BASE, "cluster.hardware", "cluster.kv"),
    "cluster.sglang.live": (
        "models", "telemetry", *BASE, "cluster.kv", "cluster.hardware", "cluster.workloads",
        "cluster.control",
        "cluster.sglang.wire",
    ),
    "cluster.sglang": ("cluster.sglang.wire",),  # the package docstring
    "cluster.engines": ("models", *BASE, "cluster.hardware", "cluster.kv", "cluster.sglang.wire"),
    "cluster.sweep": (
        "models", "telemetry", *BASE, "cluster.kv", "cluster.hardware", "cluster.workloads",
        "cluster.control",
        "cluster.policies", "cluster.sim",
    ),
    "cluster.experiments": (
        "models", "telemetry", *BASE, "cluster.kv", "cluster.hardware", "cluster.workloads",
        "cluster.control",
        "cluster.policies", "cluster.sim", "cluster.sweep",
    ),
    "cluster": (),  # cluster/__init__.py
}  # fmt: skip


def _package_of(mod: str) -> str:
    """The most specific key of ALLOWED that `mod` lives in."""
    best = ""
    for key in ALLOWED:
        if (mod == key or mod.startswith(key + ".")) and len(key) > len(best):
            best = key
    if not best:
        raise AssertionError(f"{mod} is in no layer of ALLOWED: add it (and ARCHITECTURE.md)")
    return best


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _sources() -> Iterator[Path]:
    for pkg in PACKAGES:
        yield from sorted((ROOT / pkg).rglob("*.py"))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_pkg: bool, modules: Container[str]) -> Iterator[str]:
    """Names of our modules imported anywhere in `tree` outside `if TYPE_CHECKING:`."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                keep = len(parts) - node.level + (1 if is_pkg else 0)
                base = ".".join(parts[:keep] + ([base] if base else []))
            # `from pkg import module` depends on the module (the package's __init__
            # runs first by Python's mechanics, not by a choice of the importer).
            for a in node.names:
                yield f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
        stack.extend(ast.iter_child_nodes(node))


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in _sources()}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        deps = set()
        for name in _imports(tree, mod, path.name == "__init__.py", files):
            if name.split(".")[0] in PACKAGES and name in files and name != mod:
                deps.add(name)
        graph[mod] = deps
    return graph


def test_no_source_file_over_500_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in _sources()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"split these by the data each part owns: {long}"


def test_layer_rules() -> None:
    broken = []
    for mod, deps in sorted(_graph().items()):
        own = _package_of(mod)
        for dep in sorted(deps):
            theirs = _package_of(dep)
            if theirs == own or dep.startswith(own + "."):
                continue
            allowed = ALLOWED[own]
            if not any(theirs == a or theirs.startswith(a + ".") for a in allowed):
                broken.append(f"{mod} imports {dep}: {own} may import only {allowed}")
    assert not broken, "\n".join(broken)


def test_no_import_cycles() -> None:
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layers_name_real_packages(layer: str) -> None:
    """A rule about a package that does not exist checks nothing."""
    path = ROOT / layer.replace(".", "/")
    assert (path / "__init__.py").exists() or path.with_suffix(".py").exists(), layer
