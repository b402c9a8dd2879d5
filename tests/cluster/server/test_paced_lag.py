"""A paced simulation that cannot keep its speed still lets every call in (cluster/sim/paced.py).

9 nodes and 126 agents at 5,000x: the simulator falls behind the wall clock (`lag_s` grows),
yet each pacing step holds the control-plane lock for about `max_step_wall_s` (0.25 s) or one
event (the closed loop's first arrivals take ~0.7 s on two cores), and ends early once another
thread waits for it, not for the 1,250 simulated seconds the clock asks for (~40 s of wall
time here), so a REST handler waiting for the lock gets it again and again.
"""

from __future__ import annotations

import threading
import time

from cluster.control.lock import ContendedRLock
from cluster.sim.paced import PaceConfig, PacedSimulation
from cluster.sim.simulator import SimConfig


def test_a_lagging_simulation_holds_the_lock_briefly() -> None:
    cfg = SimConfig(workload="cc", nodes=9, split="4P5D", agents=126, duration_s=86_400,
                    warmup_s=0)  # fmt: skip
    engines = PacedSimulation(cfg, None, PaceConfig(speed=5_000.0))
    engines.start()
    try:
        cp = engines.control_plane
        assert cp is not None
        waits = []
        deadline = time.monotonic() + 6.0
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            with cp.lock:
                waits.append(time.monotonic() - t0)
                now, lag = engines.now(), engines.lag_s
            time.sleep(0.05)
        # No bound on the wall time of one wait (one event of a loaded machine may take
        # seconds): the caller got the lock again and again while the simulator lagged.
        assert len(waits) >= 3, f"the lock was had {len(waits)} times in 6 s: {waits}"
        assert now > 0 and lag > 1_000  # far behind 5,000x, as expected
        assert engines.error is None
    finally:
        engines.stop()


def test_a_pacing_step_gives_way_to_a_thread_waiting_for_the_lock() -> None:
    """However long a step may hold the lock (here 10 minutes of wall time, 3,000 simulated
    seconds asked for), it ends after the sub-step in which another thread began to wait."""
    cfg = SimConfig(workload="cc", nodes=2, split="1P1D", agents=8, duration_s=86_400,
                    warmup_s=0)  # fmt: skip
    engines = PacedSimulation(cfg, None, PaceConfig(speed=0.001, max_step_wall_s=600.0))
    engines.start()
    try:
        cp, sim = engines.control_plane, engines.sim
        assert cp is not None and sim is not None
        got = threading.Event()

        def wait_for_the_lock() -> None:
            with cp.lock:
                got.set()

        with cp.lock:
            assert not cp.lock.contended
            waiter = threading.Thread(target=wait_for_the_lock)
            waiter.start()
            while not cp.lock.contended:
                time.sleep(0.001)
            start = sim.now
            engines._advance(sim, start + 3_000.0)
            assert sim.now <= start + 1.0  # one sub-step (0.1 simulated s), not 3,000 s
        waiter.join(10.0)
        # Not `not cp.lock.contended`: the live pacing thread itself may be waiting by now.
        assert got.is_set()
        with cp.lock, cp.lock:  # still re-entrant
            pass
    finally:
        engines.stop()


def test_the_lock_counts_its_waiters_and_stops_counting_when_they_have_it() -> None:
    lock = ContendedRLock()
    got = threading.Event()
    release = threading.Event()

    def waiter() -> None:
        with lock:
            got.set()
            release.wait(10.0)

    with lock, lock:  # re-entrant
        assert not lock.contended
        t = threading.Thread(target=waiter)
        t.start()
        while not lock.contended:
            time.sleep(0.001)
        assert lock.acquire(blocking=False)  # the owner re-enters while another waits
        lock.release()
    assert got.wait(10.0)
    assert not lock.contended  # the waiter holds it now; nobody waits
    assert not lock.acquire(blocking=False)  # held by the other thread
    assert not lock.acquire(True, 0.01)  # a timed wait gives up ...
    assert not lock.contended  # ... and is no longer counted
    release.set()
    t.join(10.0)
    assert lock.acquire(blocking=False)
    lock.release()
