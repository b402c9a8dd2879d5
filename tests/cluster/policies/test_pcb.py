"""The PCB's causal boundary (paper 003 §3.2): policies see x_p(t) and nothing ahead of t."""

from __future__ import annotations

import pytest

from cluster.policies import PCB_FIELDS, PolicyError, ProgramControlBlock, Signals
from cluster.policies.pcb import write_pcb
from cluster.sim.simulator import Simulator


def test_pcb_rejects_future_state_with_the_allowed_list():
    pcb = ProgramControlBlock("p", "cc", 3.0)
    for name in ("output_tokens", "program", "next_turn", "gap_s", "turns"):
        with pytest.raises(PolicyError, match=rf"PCB attribute '{name}': future state") as info:
            getattr(pcb, name)
        assert "attained_service_s" in str(info.value) and "gap_elapsed_s(now)" in str(info.value)
    # Not an AttributeError: hasattr / getattr with a default cannot hide a peek.
    with pytest.raises(PolicyError):
        hasattr(pcb, "output_tokens")
    with pytest.raises(PolicyError):
        getattr(pcb, "output_tokens", None)


def test_pcb_is_read_only_to_policies_and_holds_only_plain_values():
    pcb = ProgramControlBlock("p", "cc", 3.0)
    with pytest.raises(PolicyError, match="read-only"):
        pcb.attained_service_s = 0.0  # type: ignore[misc]
    with pytest.raises(PolicyError, match="read-only"):
        del pcb.context_tokens
    write_pcb(pcb, attained_service_s=1.5, last_completion_s=10.0)
    assert pcb.attained_service_s == 1.5 and pcb.gap_elapsed_s(12.5) == 2.5
    for name in PCB_FIELDS:
        value = getattr(pcb, name)
        assert value is None or isinstance(value, str | int | float | bool | tuple), name


def test_signals_are_read_only_and_reject_unknown_names():
    s = Signals(1.0, 0, {0: 0.5}, {0: 0.1}, {0: 3}, 1000, 8192, 1e-4, 0.03)
    assert s.kv_utilization == 0.5 and s.inflight[0] == 3
    with pytest.raises(PolicyError, match="no system signal 'future_arrivals'"):
        s.future_arrivals  # noqa: B018
    with pytest.raises(PolicyError, match="read-only"):
        s.now = 2.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.inflight[0] = 4  # type: ignore[index]


def test_simulation_rejects_a_policy_peeking_at_a_future_output_length(
    peeking_policy_file, pressure_config
):
    cfg = pressure_config(retention=str(peeking_policy_file))
    with pytest.raises(PolicyError, match=r"'output_tokens': future state is not visible"):
        Simulator(cfg).run()


def test_pcb_tracks_release_completion_and_service(pressure_config):
    sim = Simulator(pressure_config(retention="ttl", scheduling="plas", duration_s=200))
    sim.step_until(200.0)
    runs = list(sim.runs.values())
    assert runs
    for run in runs:
        pcb = run.pcb
        done = [i for i, t in enumerate(run.t_done) if t is not None]
        assert pcb.turns_completed == len(done) == run.done_turns
        assert pcb.turns_released >= pcb.turns_completed
        assert pcb.calls_in_flight == pcb.turns_released - pcb.turns_completed
        served = [r for r in sim.requests if r.run is run and r.t_done is not None]
        assert pcb.attained_service_s == pytest.approx(
            sum(r.t_done - r.t_prefill_start for r in served)
        )
        if done:
            assert pcb.last_completion_s == max(run.t_done[i] for i in done)
            assert pcb.last_prefill_node == 0 and pcb.kv_node == 0
