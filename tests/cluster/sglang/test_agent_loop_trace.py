"""The live agent loop replays a timestamped trace as the simulator does: each program once
at its arrival time by default, cycled by the agents only when asked (`cycle`), against
SGLang stand-in engines behind the live proxy (cluster/live/agent_loop.py)."""

from __future__ import annotations

import json
from pathlib import Path

from cluster.live.agent_client import TokenMap
from cluster.live.agent_loop import AgentLoop
from cluster.workloads import make_workload


def _trace(path: Path, n: int = 4) -> Path:
    path.write_text(
        "".join(
            json.dumps({"timestamp": 100 * i, "input_length": 300 + i, "output_length": 4}) + "\n"
            for i in range(n)
        )
    )
    return path


def test_a_trace_is_played_once_unless_the_agents_cycle_it(live_cluster, until, tmp_path):
    h = live_cluster(db=False)
    trace = _trace(tmp_path / "t.jsonl")
    tokens = TokenMap(vocab_lo=1, vocab_hi=256, token_scale=0.05)
    once = AgentLoop(h.url, make_workload(str(trace)), tokens, agents=3, time_scale=0.01).start()
    assert until(lambda: once.finished, 60.0)
    stats = once.stop()
    assert (stats.programs_started, stats.programs_done, stats.turns_ok) == (4, 4, 4)
    looped = AgentLoop(
        h.url, make_workload(str(trace)), tokens, agents=2, time_scale=0.01, cycle=True
    ).start()
    assert until(lambda: looped.stats.programs_done > 6, 60.0)
    stats = looped.stop()
    assert stats.programs_done > 6 and stats.turns_failed == 0 and not looped.finished
