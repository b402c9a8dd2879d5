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


def _fields(pcb: ProgramControlBlock) -> dict[str, object]:
    return {name: getattr(pcb, name) for name in PCB_FIELDS}


def test_each_event_method_changes_its_own_fields():
    pcb = ProgramControlBlock("p", "cc", 3.0)
    before = _fields(pcb)
    pcb.record_release(5.0, 1200, "root")
    pcb.record_release(6.0, 900, "sub")
    after = _fields(pcb)
    changed = {k for k in PCB_FIELDS if after[k] != before[k]}
    assert changed == {
        "turns_released", "context_tokens", "last_release_s", "calls_in_flight",
        "branch_ids", "branch_id",
    }  # fmt: skip
    assert (pcb.turns_released, pcb.calls_in_flight, pcb.branch_ids) == (2, 2, ("root", "sub"))
    pcb.record_prefill_start(3)
    pcb.record_preemption()
    assert (pcb.last_prefill_node, pcb.preemptions) == (3, 1)
    pcb.record_completion(
        9.0, 2.5, 4, 1300, "bash", "sub", branch_done=True, program_done=False,
        kv_resident_tokens=1024, kv_resident=False,
    )  # fmt: skip
    assert pcb.turns_completed == 1 and pcb.attained_service_s == 2.5
    assert (pcb.kv_node, pcb.last_decode_node, pcb.context_tokens) == (4, 4, 1300)
    assert (pcb.tool_name, pcb.tool_started_s, pcb.last_completion_s) == ("bash", 9.0, 9.0)
    assert pcb.calls_in_flight == 1 and not pcb.in_tool  # "root" is still running
    assert pcb.branch_ids == ("root",) and pcb.branch_id == "sub"
    assert (pcb.kv_resident, pcb.kv_resident_tokens) == (False, 1024)
    pcb.record_completion(10.0, 1.0, 4, 1400, None, "root", branch_done=False, program_done=False)
    assert pcb.in_tool and pcb.calls_in_flight == 0 and pcb.kv_resident_tokens == 1024
    pcb.record_retention(40.0, 2.0)
    assert (pcb.kv_protected, pcb.kv_protected_until, pcb.kv_value) == (True, 40.0, 2.0)
    pcb.record_retention(None, None, evicted_to_tokens=256)
    assert (pcb.kv_protected, pcb.kv_resident, pcb.kv_resident_tokens) == (False, False, 256)
    write_pcb(pcb, kv_resident=True)
    pcb.record_eviction()
    assert not pcb.kv_resident
    pcb.record_finish()
    assert pcb.finished and not pcb.in_tool and pcb.branch_ids == ()


def test_the_simulator_writes_pcbs_only_through_their_event_methods():
    """One place per event: no module outside cluster/policies/pcb.py sets PCB fields."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    writers = []
    for path in sorted((root / "cluster").rglob("*.py")):
        if path.name == "pcb.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = ast.unparse(node.func)
                if name.endswith("write_pcb") or (
                    name == "object.__setattr__" and "pcb" in ast.unparse(node.args[0])
                ):
                    writers.append(f"{path.relative_to(root)}:{node.lineno}")
    assert writers == []
