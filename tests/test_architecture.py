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
# uses all); inside `cluster` the layers run core (and data, the shipped real data) -> kv, workloads -> control -> policies ->
# sim -> sweep -> experiments, with the server, the live clusters and the engines beside the
# simulator, never importing it or each other (the CLI wires them together); below them the
# engine streams (`cluster.wire`) and SGLang's own formats (`cluster.sglang`) above those.
TOOLKIT_DATA = ("toolkit.queries", "toolkit.importers", "toolkit.samples")
BASE = (
    "cluster.core",
    "cluster.input_files",
    "cluster.size_limits",
    "cluster.data",
    "cluster.http_door",
)
ALLOWED: dict[str, tuple[str, ...]] = {
    "models": (),
    "telemetry": (),
    # toolkit/ by feature: its top-level modules (report, client, notebook, grafana, bench,
    # vllm_plugin, progress, extras) may import any of it; the CLI may import everything; the
    # serve composition roots only the core packages; a feature (twin, advise, validate, fit,
    # profiles) never the CLI or serve; the data and drawing layers (queries, plots, widgets,
    # importers, samples) no feature but the fits they show.
    "toolkit": ("models", "telemetry", "cluster"),
    "toolkit.cli": ("models", "telemetry", "cluster", "toolkit"),
    "toolkit.serve": ("models", "telemetry", "cluster"),
    "toolkit.twin": ("models", "telemetry", "cluster", *TOOLKIT_DATA, "toolkit.fit"),
    "toolkit.advise": ("models", "telemetry", "cluster", *TOOLKIT_DATA, "toolkit.fit", "toolkit.twin"),
    "toolkit.validate": (
        "models", "telemetry", "cluster", *TOOLKIT_DATA, "toolkit.fit", "toolkit.twin",
        "toolkit.profiles",
    ),
    "toolkit.fit": ("models", "telemetry", "cluster", "toolkit.queries"),
    "toolkit.profiles": ("models", "telemetry", "cluster", *TOOLKIT_DATA, "toolkit.fit"),
    "toolkit.samples": ("models", "telemetry", "cluster", "toolkit.importers"),
    "toolkit.importers": ("models", "telemetry", "cluster"),
    "toolkit.queries": ("models", "telemetry", "cluster", "toolkit.fit"),
    "toolkit.plots": ("models", "telemetry", "cluster", "toolkit.queries", "toolkit.fit"),
    "toolkit.widgets": (
        "models", "telemetry", "cluster", "toolkit.queries", "toolkit.plots", "toolkit.client",
    ),
    "cluster.core": (),
    "cluster.input_files": ("cluster.core",),
    "cluster.size_limits": ("cluster.core",),
    "cluster.http_door": (),  # ASGI helpers of the engine's and the server's doors
    "cluster.data": ("cluster.core",),  # the real data shipped with pdlab (and full copies)
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
    "cluster.wire": ("models", *BASE, "cluster.hardware", "cluster.kv"),
    "cluster.sglang": ("models", *BASE, "cluster.hardware", "cluster.kv", "cluster.wire"),
    "cluster.live": (
        "models", "telemetry", *BASE, "cluster.kv", "cluster.hardware", "cluster.workloads",
        "cluster.control",
        "cluster.wire", "cluster.sglang",
    ),
    "cluster.engines": (
        "models", *BASE, "cluster.hardware", "cluster.kv", "cluster.wire", "cluster.sglang",
    ),
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
            # a rule may name a layer or one module of it (`toolkit.client`)
            if not any(x == a or x.startswith(a + ".") for a in allowed for x in (theirs, dep)):
                broken.append(f"{mod} imports {dep}: {own} may import only {allowed}")
    assert not broken, "\n".join(broken)


def _inside(mod: str, pkg: str) -> bool:
    return mod == pkg or mod.startswith(pkg + ".")


def test_only_the_cli_imports_the_cli_and_serve() -> None:
    """`toolkit/cli` is the top of toolkit and `toolkit/serve` is wired only by it: no other
    module of toolkit (its top-level modules included, which ALLOWED cannot fence) imports
    either, so a feature runs from a notebook without the command line or a server."""
    broken = [
        f"{mod} imports {dep}"
        for mod, deps in sorted(_graph().items())
        if mod.startswith("toolkit") and not _inside(mod, "toolkit.cli")
        for dep in sorted(deps)
        if (_inside(dep, "toolkit.cli") or _inside(dep, "toolkit.serve"))
        and not (_inside(mod, "toolkit.serve") and _inside(dep, "toolkit.serve"))
    ]
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


# --- Size limits: classes ~400 lines, functions ~80 lines -------------------------------
# A span is `end_lineno - lineno + 1` of the `class`/`def` node (decorators excluded,
# docstring and nested definitions included); nested functions and methods are checked on
# their own under a dotted name. Plot-building modules (toolkit/plots/) are exempt from the
# function limit: a figure's layout reads best as one long list of traces and axes.
#
# The allowlists below are today's offenders with their current sizes. An entry may only
# shrink: one that grows fails, a new long function or class fails, and an entry that no
# longer exists or is now within the limit fails too (delete it), so the lists stay honest.
# When a test here fails after code moved, its message prints the lists as they should read.
# Counted at commit 62f4034 (the `docs` branch point): 30 functions over 80 lines (plots aside),
# 1 class over 400 lines.
MAX_CLASS_LINES = 400
MAX_FUNCTION_LINES = 80
FUNCTION_LIMIT_EXEMPT = ("toolkit/plots/",)

LONG_CLASSES: dict[str, int] = {
    "cluster/live/cluster.py::SGLangCluster": 440,
}

LONG_FUNCTIONS: dict[str, int] = {
    "cluster/control/bench.py::run": 81,
    "cluster/engines/shell/bootstrap.py::bootstrap_app": 118,
    "cluster/engines/shell/sglang_http.py::sglang_app": 107,
    "cluster/engines/standin/vllm_http.py::vllm_app": 86,
    "cluster/engines/torch/dp_frontend.py::create_frontend_app": 138,
    "cluster/hardware/model_shape.py::ModelShape.from_hf_config": 81,
    "cluster/hardware/operator_profile.py::build_profile": 86,
    "cluster/live/cluster.py::SGLangCluster.start": 83,
    "cluster/server/app.py::create_app": 127,
    "cluster/sim/engine_model/cluster_replay.py::replay_cluster": 126,
    "cluster/sim/metrics.py::summarize": 109,
    "telemetry/schema_imported.py::imported_tables": 184,
    "toolkit/advise/run.py::advise": 117,
    "toolkit/cli/advise.py::_print": 88,
    "toolkit/cli/advise.py::advise_command": 91,
    "toolkit/cli/fit.py::fit_command": 85,
    "toolkit/cli/lab.py::lab_command": 116,
    "toolkit/cli/profile.py::import_command": 144,
    "toolkit/cli/sweep.py::sweep_command": 94,
    "toolkit/cli/validate.py::validate_command": 89,
    "toolkit/fit/forms.py::fit_run_forms": 87,
    "toolkit/importers/lss_run.py::_assemble": 103,
    "toolkit/importers/sglang_bench.py::_run": 112,
    "toolkit/importers/vllm_bench.py::_engine": 86,
    "toolkit/importers/vllm_bench.py::read_vllm_bench": 129,
    "toolkit/report.py::build_report": 87,
    "toolkit/fit/synth.py::synth_logs": 85,
    "toolkit/twin/run.py::run_twin": 93,
}


def _spans() -> tuple[dict[str, int], dict[str, int]]:
    """`path::Qual.name` -> lines, for every function and every class of our packages."""
    functions: dict[str, int] = {}
    classes: dict[str, int] = {}
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        stack: list[tuple[ast.AST, str]] = [(ast.parse(path.read_text(), str(path)), "")]
        while stack:
            node, prefix = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = prefix + child.name
                    span = (child.end_lineno or child.lineno) - child.lineno + 1
                    book = classes if isinstance(child, ast.ClassDef) else functions
                    key = f"{rel}::{name}"
                    book[key] = max(book.get(key, 0), span)  # property setters share a name
                    stack.append((child, name + "."))
                else:
                    stack.append((child, prefix))
    return functions, classes


def _size_problems(
    spans: dict[str, int], allowed: dict[str, int], limit: int, what: str
) -> tuple[list[str], dict[str, int]]:
    """What breaks the limit or the allowlist, and the allowlist as it should read."""
    over = {k: n for k, n in spans.items() if n > limit}
    problems = [
        f"{k}: new {what} of {n} lines (limit {limit}): split it"
        for k, n in sorted(over.items())
        if k not in allowed
    ]
    for k, cap in sorted(allowed.items()):
        if k not in spans:
            problems.append(f"{k}: allowlisted {what} no longer exists: delete the entry")
        elif spans[k] <= limit:
            problems.append(f"{k}: now {spans[k]} lines, within {limit}: delete the entry")
        elif spans[k] > cap:
            problems.append(f"{k}: grew from {cap} to {spans[k]} lines: may only shrink")
    should = {k: min(n, allowed.get(k, n)) for k, n in over.items() if k in allowed}
    return problems, should


def _render(should: dict[str, int]) -> str:
    return "\n".join(f'    "{k}": {n},' for k, n in sorted(should.items()))


def test_function_sizes_only_shrink() -> None:
    functions, _ = _spans()
    checked = {k: n for k, n in functions.items() if not k.startswith(FUNCTION_LIMIT_EXEMPT)}
    problems, should = _size_problems(checked, LONG_FUNCTIONS, MAX_FUNCTION_LINES, "function")
    assert not problems, "\n".join(
        [*problems, "LONG_FUNCTIONS without new offenders would read:", _render(should)]
    )


def test_class_sizes_only_shrink() -> None:
    _, classes = _spans()
    problems, should = _size_problems(classes, LONG_CLASSES, MAX_CLASS_LINES, "class")
    assert not problems, "\n".join(
        [*problems, "LONG_CLASSES without new offenders would read:", _render(should)]
    )


def test_size_checks_catch_growth_and_stale_entries() -> None:
    """The allowlist logic itself: growth, new offenders and stale entries all fail."""
    spans = {"a.py::f": 90, "a.py::g": 120, "a.py::h": 50, "a.py::new": 81}
    allowed = {"a.py::f": 95, "a.py::g": 100, "a.py::h": 85, "a.py::gone": 99}
    problems, should = _size_problems(spans, allowed, 80, "function")
    text = "\n".join(problems)
    assert "a.py::new: new function of 81 lines" in text
    assert "a.py::g: grew from 100 to 120" in text
    assert "a.py::h: now 50 lines" in text
    assert "a.py::gone: allowlisted function no longer exists" in text
    assert "a.py::f" not in text  # shrank from 95 to 90: fine
    assert should == {"a.py::f": 90, "a.py::g": 100}


def _outside_imports(owner: str) -> Iterator[tuple[str, str]]:
    """(module, imported module) of every run-time import of a module inside the package
    `owner` from a module outside it (`from owner import X` names the package: allowed)."""
    files = {_module_name(p): p for p in _sources()}
    for mod, path in sorted(files.items()):
        if mod == owner or mod.startswith(owner + "."):
            continue
        tree = ast.parse(path.read_text(), str(path))
        for name in _imports(tree, mod, path.name == "__init__.py", files):
            if name.startswith(owner + "."):
                yield mod, name


def test_the_control_plane_is_imported_from_its_one_address() -> None:
    """Outside `cluster/control`, code imports the control plane's API from `cluster.control`
    (its `__init__` exports what others need), never from the modules inside it."""
    inner = sorted({f"{mod} imports {dep}" for mod, dep in _outside_imports("cluster.control")})
    assert not inner, (
        "import these from `cluster.control` (export them in cluster/control/__init__.py):\n"
        + "\n".join(inner)
    )


def test_the_one_address_rule_sees_inner_imports() -> None:
    """The check above would catch an inner import, a lazy one and `from pkg import module`."""
    src = (
        "from cluster.control import ControlPlane\n"
        "def f():\n    from cluster.control.state import RouteRequest\n"
        "from cluster.control import routing\n"
        "if TYPE_CHECKING:\n    from cluster.control.lock import ContendedRLock\n"
    )
    files = {"cluster.control", "cluster.control.state", "cluster.control.routing"}
    got = sorted(_imports(ast.parse(src), "cluster.sim.x", False, files))
    assert got == ["cluster.control", "cluster.control.routing", "cluster.control.state"]


def test_test_file_basenames_are_unique() -> None:
    """pytest's default (rootdir) import mode imports test modules by basename when their
    folders have no `__init__.py`: two `test_metrics.py` under tests/ break collection of the
    whole suite (it happened in CI). Name a test file after its folder's subject instead."""
    seen: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert len(seen) > 100, "found too few test files: is ROOT right?"
    assert not clashes, "rename one of each (pytest imports test files by basename):\n" + "\n".join(
        f"{name}: {', '.join(paths)}" for name, paths in sorted(clashes.items())
    )
