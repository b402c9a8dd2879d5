"""No module outside `cluster/control/` writes the control plane's state (checked from source).

Callers change the control plane only through `ControlPlane` methods, which keep its
invariants together; they read it through its accessors. An ast walk over every source
module outside `cluster/control/` (cluster, toolkit, scripts) flags, on anything reached
from a control plane (a name `cp`, an attribute `.cp` or `.control_plane`, or a local alias
of a part of one, e.g. `pl = cp.planner`, `d = self.cp.directory`, `for sw in
cp.switches.values()`) or from `.state.<ClusterState field>`:

- an assignment, augmented assignment or `del` of any of its parts (`cp.next_plan_t = t`,
  `cp.switches[n].mode = m`, `pl.window_s = w`, `cp.state.decode_load[d] -= 1`);
- a call of a mutating method on one of its parts: container mutators (`.pop(`, `.add(`,
  `.discard(`, `.clear(`, ...) and the mutators of the directory, branch table, window
  statistics, cluster state and routers (`cp.directory.clear_node(`,
  `cp.stats.record_prefill_iteration(`, `cp.router.on_done(`, ...).

Calls of the control plane's own methods (`cp.request_switch(...)`) are the API and allowed.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCANNED = ("cluster", "toolkit", "scripts")
OWNER = ROOT / "cluster" / "control"
ROOT_ATTRS = ("cp", "control_plane")
CONTAINER_MUTATORS = frozenset(
    {"pop", "popitem", "add", "discard", "clear", "update", "append", "extend", "insert",
     "remove", "setdefault", "sort", "reverse", "appendleft", "popleft", "extendleft"}
)  # fmt: skip
# Mutating methods of the control plane's parts, by the class that defines them (the test
# below checks that each still exists there, so a rename cannot silently open a hole).
DOMAIN_MUTATORS: dict[tuple[str, str], frozenset[str]] = {
    ("cluster/kv/directory.py", "KVDirectory"): frozenset(
        {"apply", "apply_all", "store", "remove", "clear_node", "add_count", "touch"}
    ),
    ("cluster/kv/branches.py", "BranchTable"): frozenset(
        {"on_request", "place", "confirm", "finish", "on_phase_switch"}
    ),
    ("cluster/control/planning.py", "WindowStats"): frozenset(
        {"record_request", "record_decode_load", "record_prefill_iteration", "prune"}
    ),
    ("cluster/control/state.py", "ClusterState"): frozenset(
        {"report", "record_sent", "release_sent", "set_models", "set_prefill_predictor"}
    ),
    ("cluster/control/routing.py", "Router"): frozenset({"route", "on_prefill_done", "on_done"}),
    ("cluster/control/routing.py", "DecodeBinder"): frozenset({"bind"}),
    ("cluster/control/switching.py", "SwitchBook"): frozenset(
        {"hold", "release", "begin", "finish", "cancel", "set_mode"}
    ),
    ("cluster/control/planner_driver.py", "PlannerDriver"): frozenset(
        {"configure", "schedule_next", "step", "evaluate"}
    ),
}
MUTATORS = CONTAINER_MUTATORS.union(*DOMAIN_MUTATORS.values())
NAVIGATORS = frozenset({"get", "setdefault", "values", "items"})  # return a part of the part

# Writes in the simulator, which is being split into layers apart from this change:
# (path, code) pairs, exact. Its KV stores and removals are to enter through
# `ControlPlane.on_kv_events` (the batched entry of live engines); its zero-count listener
# through `ControlPlane.add_zero_count_listener`; its prefill iterations through
# `ControlPlane.on_prefill_iteration`; the queued requests of a switching node through
# `ControlPlane.reroute(req, from_node=node)`. Delete each entry when its code is gone
# (`test_known_writes_still_exist` says which); code that moved to another file fails the
# main test, naming the ControlPlane method to call.
KNOWN_ELSEWHERE: frozenset[tuple[str, str]] = frozenset()


def _class_methods(path: str, cls: str) -> set[str]:
    tree = ast.parse((ROOT / path).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
    raise AssertionError(f"{cls} is not defined in {path}")


def _state_fields() -> frozenset[str]:
    tree = ast.parse((OWNER / "state.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "ClusterState":
            return frozenset(
                s.target.id
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            )
    raise AssertionError("ClusterState is not defined in cluster/control/state.py")


STATE_FIELDS = _state_fields()


class _Checker:
    """Depth of an expression below a control plane: 0 is the control plane itself, 1 one
    of its attributes, and so on; None when the expression does not come from one."""

    def __init__(self) -> None:
        self.aliases: dict[str, int] = {}

    def depth(self, e: ast.expr) -> int | None:
        if isinstance(e, ast.Name):
            return 0 if e.id == "cp" else self.aliases.get(e.id)
        if isinstance(e, ast.Attribute):
            if e.attr in ROOT_ATTRS:
                return 0
            if (
                e.attr in STATE_FIELDS
                and isinstance(e.value, ast.Attribute)
                and e.value.attr == "state"
            ):
                return 2
            d = self.depth(e.value)
            return None if d is None else d + 1
        if isinstance(e, ast.Subscript):
            d = self.depth(e.value)
            return None if d is None else d + 1
        if (
            isinstance(e, ast.Call)
            and isinstance(e.func, ast.Attribute)
            and e.func.attr in NAVIGATORS
        ):
            d = self.depth(e.func.value)
            return None if d is None or d == 0 else d + 1
        return None

    def collect_aliases(self, body: list[ast.stmt]) -> None:
        """Local names bound to a part of a control plane (flow-insensitive, to a fixpoint;
        a name keeps its first binding found, so `x = x.parent` cannot loop)."""
        changed = True
        while changed:
            changed = False
            for node in (n for stmt in body for n in ast.walk(stmt)):
                bound: list[tuple[ast.expr, int | None]] = []
                if isinstance(node, ast.Assign):
                    bound = [(t, self.depth(node.value)) for t in node.targets]
                elif isinstance(node, ast.AnnAssign | ast.NamedExpr) and node.value is not None:
                    bound = [(node.target, self.depth(node.value))]
                elif isinstance(node, ast.For | ast.comprehension):
                    d = self.depth(node.iter)
                    bound = [(t, None if d is None else d + 1) for t in ast.walk(node.target)]
                for target, d in bound:
                    name = target.id if isinstance(target, ast.Name) else None
                    if name is not None and d is not None and name not in self.aliases:
                        self.aliases[name] = d
                        changed = True

    def writes(self, body: list[ast.stmt]) -> Iterator[ast.AST]:
        for node in (n for stmt in body for n in ast.walk(stmt)):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            elif isinstance(node, ast.Delete):
                targets = node.targets
            for t in targets:
                for part in ast.walk(t):
                    if isinstance(part, ast.Attribute | ast.Subscript):
                        d = self.depth(part)
                        if d is not None and d >= 1:
                            yield part
                            break
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in MUTATORS
            ):
                d = self.depth(node.func.value)
                if d is not None and d >= 1:
                    yield node.func


def _scopes(tree: ast.Module) -> Iterator[list[ast.stmt]]:
    """The module's top level, each class body and each function body (aliases are local to
    a function: a name bound in one method is not an alias in another)."""
    defs = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
    yield [s for s in tree.body if not isinstance(s, defs)]
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            yield [s for s in node.body if not isinstance(s, defs)]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node.body


def writes_in(source: str) -> list[tuple[int, str]]:
    """(line, code) of every write to control-plane state in `source`."""
    tree = ast.parse(source)
    found: set[tuple[int, str]] = set()
    for body in _scopes(tree):
        checker = _Checker()
        checker.collect_aliases(body)
        for node in checker.writes(body):
            found.add((node.lineno, ast.unparse(node)))
    return sorted(found)


def _sources() -> Iterator[Path]:
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if OWNER not in path.parents:
                yield path


def test_no_module_outside_the_control_layer_writes_control_plane_state() -> None:
    found = []
    for path in _sources():
        rel = str(path.relative_to(ROOT))
        for line, code in writes_in(path.read_text()):
            if (rel, code) not in KNOWN_ELSEWHERE:
                found.append(f"{rel}:{line}: {code}")
    assert not found, (
        "these write the control plane's state; call a ControlPlane method instead "
        "(add one in cluster/control/ if none fits):\n" + "\n".join(found)
    )


def test_known_writes_still_exist() -> None:
    """An exemption whose code is gone would hide a new write of the same text."""
    stale = []
    for rel, code in sorted(KNOWN_ELSEWHERE):
        path = ROOT / rel
        if not path.exists() or code not in {c for _, c in writes_in(path.read_text())}:
            stale.append(f"{rel}: {code}")
    assert not stale, "delete these entries of KNOWN_ELSEWHERE:\n" + "\n".join(stale)


def _private_parts() -> frozenset[str]:
    tree = ast.parse((OWNER / "parts.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "ControlPlaneParts":
            return frozenset(
                s.target.id
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            )
    raise AssertionError("ControlPlaneParts is not defined in cluster/control/parts.py")


def private_reads_in(source: str) -> list[tuple[int, str]]:
    """(line, code) of every use of a control plane's private part (`cp._state`, ...)."""
    parts = _private_parts()
    found: set[tuple[int, str]] = set()
    tree = ast.parse(source)
    for body in _scopes(tree):
        checker = _Checker()
        checker.collect_aliases(body)
        for node in (n for stmt in body for n in ast.walk(stmt)):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in parts
                and checker.depth(node.value) == 0
            ):
                found.add((node.lineno, ast.unparse(node)))
    return sorted(found)


def test_the_control_planes_parts_are_private_to_the_control_layer() -> None:
    """Outside `cluster/control` the control plane is read through its accessors (`phases()`,
    `node_blocks(n)`, `view`, ...), never through its parts (cluster/control/parts.py)."""
    assert len(_private_parts()) >= 10
    found = []
    for path in _sources():
        rel = str(path.relative_to(ROOT))
        found += [f"{rel}:{line}: {code}" for line, code in private_reads_in(path.read_text())]
    assert not found, "read these through a ControlPlane accessor:\n" + "\n".join(found)
    sample = "def f(sim):\n    cp = sim.cp\n    return cp._state.phases, sim.cp._directory\n"
    assert [code for _, code in private_reads_in(sample)] == ["cp._state", "sim.cp._directory"]


@pytest.mark.parametrize(("where", "cls"), sorted(DOMAIN_MUTATORS))
def test_listed_mutators_exist(where: str, cls: str) -> None:
    missing = DOMAIN_MUTATORS[(where, cls)] - _class_methods(where, cls)
    assert not missing, f"{cls} ({where}) has no methods {sorted(missing)}: update the list"


# The hand edits callers made before the control plane had methods for them (the proxy, the
# SGLang cluster, the role switcher, the live server, the simulator), and reads that are fine.
BEFORE = """
def place(self, rec, p, d):
    cp = self.host.cp
    cp.router.on_done(rec.request_id, p)
    cp.state.sent.get(p, {}).pop(rec.request_id, None)
    cp.state.decode_load[d] = max(cp.state.decode_load.get(d, 0) - 1, 0)

def on_switched(self, rec):
    self.cp.switches[rec.node_id].mode = "relaunch"
    self.cp.switches.pop(rec.node_id, None)

def sync(self, node):
    unavailable = self.cp.state.unavailable
    unavailable.add(node)
    unavailable.discard(node)

def restart(self, node):
    self.cp.directory.clear_node(node)

def fpm(self, node, now, p):
    self.cp.stats.record_prefill_iteration(node, now, p.t_uc, p.t_c, p.t_rst)

def set_planner(self, window_s, slices, copy_price):
    cp = self._sim().cp
    pl = cp.planner
    pl.window_s = window_s
    cp.next_plan_t = min(cp.next_plan_t, cp.now + window_s)
    pl.slices = slices
    cp.state.copy_price_s_per_token = copy_price

def store(self, node, h):
    d = self.cp.directory
    d.remove(node, h, "gpu")
    for sw in self.cp.switches.values():
        sw.drained += 1
    del cluster.cp.state.reports[node]
    x.state.unavailable.clear()

def reads(self, node):
    cp = self.cp
    blocks = cp.directory.node_blocks(node)
    models = cp.models()
    models[node] = None
    sw = cp.pending_switch(node)
    cp.request_switch(node, "decode", 0.0)
    cp.mark_unavailable(node, "engine down")
    app.state.live = self
    return cp.state.phases[node], cp.switches.get(node), blocks, sw
"""


def test_a_name_bound_in_one_method_is_no_alias_in_another() -> None:
    src = textwrap.dedent(
        """
        class Service:
            def busy(self, cp):
                return [n for n, s in cp.switches.items()]

            def snapshot(self, snap):
                for n in snap["nodes"]:
                    n["blocks"] = 0
        """
    )
    assert writes_in(src) == []


def test_the_checker_catches_the_hand_edits_of_before() -> None:
    got = [code for _, code in writes_in(textwrap.dedent(BEFORE))]
    assert got == [
        "cp.router.on_done",
        "cp.state.sent.get(p, {}).pop",
        "cp.state.decode_load[d]",
        "self.cp.switches[rec.node_id].mode",
        "self.cp.switches.pop",
        "unavailable.add",
        "unavailable.discard",
        "self.cp.directory.clear_node",
        "self.cp.stats.record_prefill_iteration",
        "pl.window_s",
        "cp.next_plan_t",
        "pl.slices",
        "cp.state.copy_price_s_per_token",
        "d.remove",
        "sw.drained",
        "cluster.cp.state.reports[node]",
        "x.state.unavailable.clear",
    ]
