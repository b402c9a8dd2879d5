"""Loading user and shipped policies for the planes (paper 003 App. E, §5.3).

A policy spec is one of:
- a registry name: `ttl`, `plas`, `session-affinity`, ... (`RETENTION_POLICIES`, ...);
- a Python file, `path/to/policy.py` or `path/to/policy.py:ClassName`;
- a module, `package.module:ClassName` (or `package.module` with one policy class);
- in notebooks, a policy class or instance.
Keyword parameters go to the class's constructor. A class is validated for its family's
hooks when it is loaded (retention: `on_turn_complete`, `on_turn_arrival`; scheduling:
`priority`; dispatch: `select`), and the hooks' arity is checked: `on_turn_complete` may
take `(pcb, now)` (App. E) or `(pcb, request_id, now)` (the App. F listings). Every bound
hook is guarded (`guard.GuardedHook`): a failure inside it is a `PolicyError` naming the
policy, the hook and the simulated time, and a call longer than `hook_budget_s` wall
seconds is stopped and fails the run.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, NamedTuple

from cluster.core import ConfigError, Registry
from cluster.policies.dispatch import DISPATCH_POLICIES, DispatchPolicy
from cluster.policies.errors import PolicyError
from cluster.policies.guard import DEFAULT_HOOK_BUDGET_S, GuardedHook, check_budget
from cluster.policies.retention import RETENTION_POLICIES, RetentionPolicy
from cluster.policies.scheduling import SCHEDULING_POLICIES, SchedulingPolicy

Family = Literal["retention", "scheduling", "dispatch"]

HOOKS: dict[str, tuple[str, ...]] = {
    "retention": ("on_turn_complete", "on_turn_arrival"),
    "scheduling": ("priority",),
    "dispatch": ("select",),
}
REGISTRIES: dict[str, Registry[Any]] = {
    "retention": RETENTION_POLICIES,
    "scheduling": SCHEDULING_POLICIES,
    "dispatch": DISPATCH_POLICIES,
}
_BASES = (RetentionPolicy, SchedulingPolicy, DispatchPolicy)


class LoadedPolicy(NamedTuple):
    """A policy instance with its hooks bound in the planes' calling convention."""

    family: str
    name: str
    instance: Any
    hooks: dict[str, Callable[..., Any]]
    uses_signals: bool


def load_policy(
    family: Family,
    spec: Any,
    params: dict[str, Any] | None = None,
    *,
    hook_budget_s: float | None = DEFAULT_HOOK_BUDGET_S,
) -> LoadedPolicy:
    """Resolve `spec` (see module docstring) into a validated policy of `family`.

    `hook_budget_s`: wall seconds one hook call may run before it is stopped and the run
    fails with a `PolicyError` (None: no limit; failures are still named).
    """
    if family not in HOOKS:
        raise ConfigError(f"unknown policy family {family!r}; choose one of: {', '.join(HOOKS)}")
    budget = check_budget(hook_budget_s)
    params = dict(params or {})
    registry = REGISTRIES[family]
    if isinstance(spec, str) and spec in registry:
        try:
            return _bind(family, registry.create(spec, **params), spec, budget)
        except TypeError as exc:
            raise ConfigError(f"{family} policy {spec!r}: bad parameters {params}: {exc}") from None
    if isinstance(spec, str):
        obj = _resolve_string(family, spec)
        label = spec
    else:
        obj = spec
        label = spec.__name__ if inspect.isclass(spec) else type(spec).__name__
    if inspect.isclass(obj):
        check_hooks(family, obj, label)
        try:
            instance = obj(**params)
        except TypeError as exc:
            raise ConfigError(
                f"{family} policy {label!r}: bad parameters {params}: {exc}"
            ) from None
        except ConfigError:
            raise
        except (Exception, SystemExit) as exc:
            raise PolicyError(
                f"{family} policy {label!r}: its constructor failed: {type(exc).__name__}: {exc}"
            ) from exc
    else:
        if params:
            raise ConfigError(
                f"{family} policy {label!r} is an instance; parameters {params} cannot apply"
            )
        instance = obj
        check_hooks(family, type(instance), label)
    return _bind(family, instance, label, budget)


def _bind(family: str, instance: Any, label: str, budget_s: float | None) -> LoadedPolicy:
    name = str(getattr(instance, "name", None) or type(instance).__name__)
    if name in ("custom",):
        name = type(instance).__name__
    try:
        instance.signals = None
    except AttributeError:
        raise PolicyError(
            f"{family} policy {label!r} must allow the attribute 'signals' (the plane sets the "
            "system signals there before each hook); subclass the base class or drop __slots__"
        ) from None
    hooks: dict[str, Callable[..., Any]] = {
        h: GuardedHook(_adapt(family, h, getattr(instance, h), label), family, name, h, budget_s)
        for h in HOOKS[family]
    }
    return LoadedPolicy(
        family, name, instance, hooks, bool(getattr(instance, "uses_signals", True))
    )


def check_hooks(family: str, cls: type, label: str) -> None:
    missing = [h for h in HOOKS[family] if not callable(getattr(cls, h, None))]
    if missing:
        raise PolicyError(
            f"{family} policy {label!r} ({cls.__name__}) lacks hook(s) {', '.join(missing)}; a "
            f"{family} policy implements {', '.join(HOOKS[family])} (see cluster.policies)"
        )


def _adapt(family: str, hook: str, fn: Callable[..., Any], label: str) -> Callable[..., Any]:
    """Bind a hook in the planes' convention; on_turn_complete gets (pcb, request_id, now)."""
    try:
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):  # builtins without signatures: trust the documented form
        params = []
    n = len(params)
    expected = {
        "on_turn_complete": (2, 3),
        "on_turn_arrival": (2,),
        "priority": (2,),
        "select": (3,),
    }[hook]
    if params and n not in expected:
        forms = {
            "on_turn_complete": "(pcb, now) or (pcb, request_id, now)",
            "on_turn_arrival": "(pcb, now)",
            "priority": "(pcb, now)",
            "select": "(pcb, inflight, now)",
        }[hook]
        raise PolicyError(
            f"{family} policy {label!r}: {hook} must take {forms}, it takes {n} arguments"
        )
    if hook == "on_turn_complete":
        if n == 3:
            return fn
        return lambda pcb, request_id, now: fn(pcb, now)
    return fn


def _resolve_string(family: str, spec: str) -> Any:
    registry = REGISTRIES[family]
    path_part, _, cls_name = _split_spec(spec)
    if path_part.endswith(".py") or "/" in path_part or os.sep in path_part:
        module = _load_file(family, path_part)
    elif ":" in spec or "." in path_part:
        try:
            module = importlib.import_module(path_part)
        except ImportError as exc:
            raise ConfigError(
                f"{family} policy {spec!r}: cannot import module {path_part!r} ({exc})"
            ) from None
    else:
        raise ConfigError(
            f"unknown {family} policy {spec!r}; choose one of: {', '.join(registry.names())}, or "
            "a file path (path/to/policy.py[:Class]) or a module (package.module:Class)"
        )
    return _pick_class(family, module, cls_name or None, spec)


def _split_spec(spec: str) -> tuple[str, str, str]:
    # 'file.py:Class' or 'pkg.mod:Class'; a Windows drive letter has its colon at index 1.
    head, sep, tail = spec.rpartition(":")
    if not sep or len(head) <= 1 or "/" in tail or os.sep in tail:
        return spec, "", ""
    return head, sep, tail


def _load_file(family: str, path_str: str) -> ModuleType:
    path = Path(path_str).expanduser()
    if not path.is_file():
        raise ConfigError(f"{family} policy file {path_str!r} not found (cwd {os.getcwd()})")
    resolved = path.resolve()
    digest = hashlib.sha1(str(resolved).encode()).hexdigest()[:10]
    mod_name = f"pdlab_policy_{resolved.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(mod_name, resolved)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{family} policy file {path_str!r} is not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        del sys.modules[mod_name]
        raise ConfigError(f"{family} policy file {path_str!r} failed to import: {exc!r}") from exc
    return module


def _pick_class(family: str, module: ModuleType, cls_name: str | None, spec: str) -> Any:
    if cls_name:
        obj = getattr(module, cls_name, None)
        if obj is None:
            raise ConfigError(f"{family} policy {spec!r}: {module.__name__} has no {cls_name!r}")
        return obj
    hooks = HOOKS[family]
    found = [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj)
        and obj.__module__ == module.__name__
        and obj not in _BASES
        and all(callable(getattr(obj, h, None)) for h in hooks)
    ]
    if len(found) == 1:
        return found[0]
    if not found:
        raise PolicyError(
            f"{family} policy {spec!r}: no class in {module.__name__} implements {', '.join(hooks)}"
        )
    names = ", ".join(sorted(c.__name__ for c in found))
    raise ConfigError(
        f"{family} policy {spec!r}: several candidate classes ({names}); name one as {spec}:Class"
    )
