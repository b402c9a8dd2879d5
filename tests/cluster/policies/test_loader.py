"""Loading policies by name, file, module, class or instance, with hook validation."""

from __future__ import annotations

import math
import sys
import textwrap

import pytest

from cluster.core import ConfigError
from cluster.policies import (
    EVICT,
    RELEASE,
    FixedTTL,
    PolicyError,
    ProgramControlBlock,
    RetentionPolicy,
    load_policy,
    protect,
)
from cluster.policies.retention import normalize_decision
from cluster.sim.simulator import SimConfig, Simulator


def _write(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def test_registry_names_with_parameters_and_clear_misses():
    p = load_policy("retention", "ttl", {"tau_s": 5.0})
    assert p.name == "ttl" and p.instance.tau_s == 5.0
    pcb = ProgramControlBlock("p", "w", 0.0)
    assert p.hooks["on_turn_complete"](pcb, "p/0", 1.0) == protect(6.0)
    with pytest.raises(ConfigError, match=r"unknown retention policy 'lfu'; choose one of: .*ttl"):
        load_policy("retention", "lfu")
    with pytest.raises(ConfigError, match=r"retention policy 'ttl': bad parameters \{'tau': 1\}"):
        load_policy("retention", "ttl", {"tau": 1})
    with pytest.raises(ConfigError, match="'tau_s' must be a number >= 0"):
        load_policy("retention", "ttl", {"tau_s": -1})
    with pytest.raises(ConfigError, match="unknown policy family"):
        load_policy("eviction", "lru")  # type: ignore[arg-type]


def test_file_and_module_specs_pick_the_policy_class(tmp_path, monkeypatch):
    _write(
        tmp_path,
        "mypol.py",
        """
        from cluster.policies import SchedulingPolicy

        class Helper:
            pass

        class ShortFirst(SchedulingPolicy):
            def __init__(self, scale=1.0):
                self.scale = scale

            def priority(self, pcb, now):
                return self.scale * pcb.context_tokens
        """,
    )
    p = load_policy("scheduling", str(tmp_path / "mypol.py"), {"scale": 2.0})
    assert p.name == "ShortFirst" and p.instance.scale == 2.0
    p2 = load_policy("scheduling", f"{tmp_path / 'mypol.py'}:ShortFirst")
    assert type(p2.instance).__name__ == "ShortFirst"
    monkeypatch.syspath_prepend(str(tmp_path))
    p3 = load_policy("scheduling", "mypol:ShortFirst")
    assert type(p3.instance).__name__ == "ShortFirst"
    sys.modules.pop("mypol", None)
    with pytest.raises(ConfigError, match="has no 'Nope'"):
        load_policy("scheduling", f"{tmp_path / 'mypol.py'}:Nope")
    with pytest.raises(ConfigError, match="not found"):
        load_policy("scheduling", str(tmp_path / "missing.py"))
    with pytest.raises(ConfigError, match="cannot import module"):
        load_policy("scheduling", "no_such_pkg.mod:Cls")


def test_missing_hooks_and_wrong_arity_are_rejected_at_load(tmp_path):
    path = _write(
        tmp_path,
        "bad.py",
        """
        class OnlyComplete:
            def on_turn_complete(self, pcb, now):
                return "release"
        """,
    )
    with pytest.raises(
        PolicyError, match=r"lacks hook\(s\) on_turn_arrival; a retention policy implements"
    ):
        load_policy("retention", f"{path}:OnlyComplete")

    class Arity(RetentionPolicy):
        def on_turn_complete(self, pcb, now):
            return "release"

        def on_turn_arrival(self, pcb):  # type: ignore[override]
            return None

    with pytest.raises(PolicyError, match=r"on_turn_arrival must take \(pcb, now\)"):
        load_policy("retention", Arity)

    class Slotted:
        __slots__ = ()

        def priority(self, pcb, now):
            return 0

    with pytest.raises(PolicyError, match="must allow the attribute 'signals'"):
        load_policy("scheduling", Slotted)
    with pytest.raises(PolicyError, match=r"no class in .* implements select"):
        load_policy("dispatch", str(path))


def test_paper_listing_form_of_on_turn_complete_is_accepted(tmp_path):
    """Paper 003 Listing 1 (seed TTL retention) as written, with its tuple decisions."""
    path = _write(
        tmp_path,
        "seed.py",
        """
        from cluster.policies import RetentionPolicy

        class EvolvedRetention(RetentionPolicy):
            TAU_S = 2.0

            def on_turn_complete(self, pcb, request_id, now):
                return ("protect", now + self.TAU_S)

            def on_turn_arrival(self, pcb, now):
                return "release"
        """,
    )
    p = load_policy("retention", str(path))
    pcb = ProgramControlBlock("p", "w", 0.0)
    got = normalize_decision(p.hooks["on_turn_complete"](pcb, "p/3", 10.0), p.name, "x")
    assert got == protect(12.0)
    assert normalize_decision(p.hooks["on_turn_arrival"](pcb, 11.0), p.name, "x") == RELEASE


def test_decisions_are_normalized_or_rejected():
    assert normalize_decision("evict", "p", "h") == EVICT
    assert normalize_decision("none", "p", "h") is None
    assert normalize_decision(("protect", math.inf, 3), "p", "h") == protect(math.inf, 3.0)
    for bad in ("keep", ("protect",), ("protect", "soon"), ("protect", float("nan")), 42):
        with pytest.raises(PolicyError, match="retention policy 'p'"):
            normalize_decision(bad, "p", "h")


def test_classes_and_instances_run_in_the_simulator(pressure_config):
    """Notebook use: a class or an instance in SimConfig; the config stays JSON-able."""
    import json

    from cluster.sim.runner import config_dict

    cfg = pressure_config(retention=FixedTTL(tau_s=4.0), scheduling="plas", duration_s=150)
    assert json.loads(json.dumps(config_dict(cfg)))["retention"] == "python:FixedTTL"
    summary = Simulator(cfg).run()
    assert summary["retention"] == "ttl" and summary["requests"] > 10

    class Bad(RetentionPolicy):
        def on_turn_complete(self, pcb, now):
            return "keep-forever"

    with pytest.raises(PolicyError, match="returned 'keep-forever'"):
        Simulator(pressure_config(retention=Bad, duration_s=150)).run()


def test_bad_plane_configs_are_rejected_with_clear_messages():
    with pytest.raises(ConfigError, match=r">= 1 with --split collocated"):
        SimConfig(nodes=1, split="1P0D").validate()
    with pytest.raises(ConfigError, match="use --kv-fetch none"):
        Simulator(
            SimConfig(
                nodes=1,
                split="collocated",
                host_kv=False,
                kv_fetch="async",
                duration_s=10,
                warmup_s=0,
            )
        )
    with pytest.raises(ConfigError, match="unknown scheduling policy 'sjf'"):
        Simulator(
            SimConfig(nodes=1, split="collocated", scheduling="sjf", duration_s=10, warmup_s=0)
        )


def test_paper_listings_run_as_candidate_files(pressure_config):
    """App. F's seed and evolved policies load from their files and run in the simulator."""
    from cluster.policies.seeds import SEEDS_DIR

    for name, family in (
        ("ttl_seed.py", "retention"),
        ("evolved_retention.py", "retention"),
        ("plas_seed.py", "scheduling"),
        ("evolved_scheduling.py", "scheduling"),
    ):
        path = str(SEEDS_DIR / name)
        assert load_policy(family, path).family == family  # type: ignore[arg-type]
        s = Simulator(pressure_config(**{family: path}, duration_s=200)).run()
        assert s["requests"] > 10 and s[family] in ("EvolvedRetention", "EvolvedScheduling")
