"""The event kernel: (time, priority, sequence) order, the clock, events scheduled by events."""

import itertools

from cluster.sim.kernel import ARRIVAL, DECODE_END, PREFILL_END, TICK, EventKernel


def test_events_run_by_time_then_priority_then_scheduling_order():
    k = EventKernel()
    ran: list[tuple[float, str]] = []

    def log(name: str) -> None:
        ran.append((k.now, name))

    k.push(2.0, ARRIVAL, log, "arrival@2")
    k.push(1.0, TICK, log, "tick@1")
    k.push(1.0, PREFILL_END, log, "prefill-end@1")
    k.push(1.0, PREFILL_END, log, "prefill-end@1 second")
    k.push(1.0, DECODE_END, log, "decode-end@1")
    assert k.step_until(5.0) == 5.0
    assert ran == [
        (1.0, "prefill-end@1"),
        (1.0, "prefill-end@1 second"),
        (1.0, "decode-end@1"),
        (1.0, "tick@1"),
        (2.0, "arrival@2"),
    ]
    assert k.events_processed == 5 and k.now == 5.0


def test_step_until_stops_at_the_bound_and_resumes():
    k = EventKernel()
    ran: list[float] = []

    def chain(n: int) -> None:
        ran.append(k.now)
        if n:
            k.push(k.now + 1.0, TICK, chain, n - 1)

    k.push(0.5, TICK, chain, 4)
    assert k.step_until(2.5) == 2.5
    assert ran == [0.5, 1.5, 2.5]  # an event at the bound runs
    assert k.step_until(1.0) == 2.5  # the clock never goes back
    k.step_until(10.0)
    assert ran == [0.5, 1.5, 2.5, 3.5, 4.5] and k.events_processed == 5


def test_progress_is_reported_at_most_once_per_step():
    k = EventKernel()
    for i in range(100):
        k.push(i * 0.1, TICK, lambda: None)
    seen: list[float] = []
    k.step_until(20.0, progress=seen.append, progress_step_s=2.0)
    assert seen and all(b - a >= 2.0 for a, b in itertools.pairwise(seen))
    assert seen[0] == 0.0


def test_halt_stops_the_run_at_the_current_event():
    k = EventKernel()
    ran: list[float] = []
    k.push(1.0, ARRIVAL, lambda: ran.append(k.now))
    k.push(2.0, ARRIVAL, lambda: (ran.append(k.now), k.halt()))
    k.push(2.0, TICK, lambda: ran.append(-1.0))  # same time, after the halting event
    k.push(3.0, ARRIVAL, lambda: ran.append(k.now))
    assert k.step_until(10.0) == 2.0  # the clock stays at the halting event
    assert ran == [1.0, 2.0] and k.halted and k.events_processed == 2
    assert k.step_until(20.0) == 2.0 and ran == [1.0, 2.0]  # nothing runs after a halt
