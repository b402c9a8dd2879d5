"""One configuration per run (issue 25, item 2): SimConfig's fields are the single source of the
simulation options of `pdlab simulate` and `serve` (flag, type, default, help, ceiling), and
`SimConfig.resolve()` does the resolution the simulator used to do in its constructor."""

from __future__ import annotations

import dataclasses

import pytest
import typer
from typer.testing import CliRunner

from cluster import size_limits as limits
from cluster.core import ConfigError
from cluster.sim.config import CLI_FIELDS, SimConfig
from cluster.sim.fields import cli_fields, sim_field
from cluster.sim.resolved import ResolvedConfig
from toolkit.cli import app
from toolkit.cli.sim_command import sim_command
from toolkit.cli.sim_options import SimOptions


def _params(command: str) -> dict[str, object]:
    group = typer.main.get_command(app)
    return {p.name: p for p in group.commands[command].params}  # type: ignore[attr-defined]


def test_simulate_offers_every_flagged_field_with_its_help_and_default() -> None:
    params = _params("simulate")
    offered = [f for f in CLI_FIELDS if f.simulate]
    assert len(offered) >= 30
    for spec in offered:
        p = params[spec.param]
        assert f"--{spec.flag}" in p.opts, spec  # type: ignore[attr-defined]
        assert p.help == spec.help and p.default == spec.default, spec  # type: ignore[attr-defined]
    # a field's command-line default may differ (None: resolved from other options)
    assert params["agents"].default is None and SimConfig().agents == 126  # type: ignore[attr-defined]
    assert params["form"].default == SimConfig().fit_form == "paper"  # type: ignore[attr-defined]


def test_serve_takes_its_subset_with_the_demo_defaults() -> None:
    params = _params("serve")
    assert params["duration"].default == 86_400.0 and params["warmup"].default == 0.0  # type: ignore[attr-defined]
    assert params["window"].help == next(f.help for f in CLI_FIELDS if f.param == "window")  # type: ignore[attr-defined]
    assert "max_num_seqs" not in params  # serve offers the options it names


def test_a_decorated_command_receives_one_simoptions() -> None:
    got: list[SimOptions] = []
    demo = typer.Typer()

    @demo.command()
    @sim_command(only=("nodes", "duration", "cycle", "host_kv", "policy_param"))
    def run(sim: SimOptions, verbose: bool = typer.Option(False, help="Say more")) -> None:
        got.append(sim)

    res = CliRunner().invoke(
        demo,
        ["--nodes", "2", "--duration", "60", "--cycle", "--no-host-kv",
         "--policy-param", "retention.tau_s=5"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    fields = got[0].fields()
    assert fields["nodes"] == 2 and fields["duration_s"] == 60.0 and fields["warmup_s"] == 10.0
    assert fields["trace_cycle"] is True and fields["host_kv"] is False
    assert fields["retention_params"] == {"tau_s": 5}
    with pytest.raises(TypeError, match="not simulation options"):
        sim_command(only=("no_such_option",))(run)
    with pytest.raises(TypeError, match="unknown options: bogus"):
        SimOptions(bogus=1)


def test_a_new_sim_field_is_an_option_and_a_checked_size_at_once() -> None:
    @dataclasses.dataclass(frozen=True)
    class Demo:
        depth_s: float = sim_field(
            1.0, flag="depth", type=float, help="How deep", limit=limits.SIM_SECONDS
        )
        hidden: int = sim_field(3, flag=None, limit=limits.NODES)
        plain: int = 0

    depth, hidden = cli_fields(Demo)
    assert (depth.param, depth.field, depth.default, depth.label) == (
        "depth",
        "depth_s",
        1.0,
        "--depth",
    )
    assert hidden.flag is None and hidden.label == "hidden"
    # SimConfig checks every field's ceiling under its option's name
    with pytest.raises(ConfigError, match=r"--relaunch must be at most 10,000,000"):
        SimConfig(relaunch_s=1e9).validate()
    with pytest.raises(ConfigError, match=r"planner_tick_s must be at most"):
        SimConfig(planner_tick_s=1e9).validate()


def test_resolve_applies_the_router_dependent_defaults_and_loads_policies() -> None:
    run = SimConfig(nodes=2, split="1P1D", duration_s=60, warmup_s=10, agents=4).resolve()
    assert isinstance(run, ResolvedConfig)
    assert (run.kv_fetch, run.decode_binder, run.split) == ("async", "fewest", (1, 1))
    assert run.fifo and run.retention is None and not run.track_kv
    assert run.initial_phases([5, 6]) == {5: "prefill", 6: "decode"}
    base = SimConfig(nodes=1, split="collocated", duration_s=60, warmup_s=10, agents=4)
    other = dataclasses.replace(
        base, router="round-robin", host_kv=False, retention="ttl"
    ).resolve()
    assert (other.kv_fetch, other.decode_binder) == ("none", "round-robin")
    assert other.retention is not None and other.retention.name == "ttl" and other.track_kv
    assert other.collocated_only and other.initial_phases([0]) == {0: "prefill"}
    with pytest.raises(ConfigError, match="host_kv=False has no shared host pool"):
        dataclasses.replace(base, host_kv=False, kv_fetch="sync").resolve()
    with pytest.raises(ConfigError, match=r"trace_cycle \(--cycle\) needs a trace workload"):
        dataclasses.replace(base, trace_cycle=True).resolve()
