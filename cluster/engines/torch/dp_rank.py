"""One DP rank of a torch engine group, as its own process (`python -m ...dp_rank SPEC`).

A rank is a whole torch engine (scheduler, paged KV, prefix cache, SGLang HTTP API on its
own port) whose scheduler is `dp_scheduler.RankScheduler` and whose MoE layers, under
expert parallelism, keep only this rank's experts and dispatch through the group
(`expert_parallel`). `RankGroup` joins the group's torch.distributed world (gloo on CPU;
NCCL for the experts' collectives on CUDA, with a gloo group beside it for the step
all-reduce, as vLLM keeps its DP group on the CPU), and talks to the coordinator in the
front end over ZMQ: it pushes counts and wave notices, and a thread takes START_DP_WAVE.

The launcher (`dp_group.DPGroup`) passes a `RankSpec` as JSON; the process prints one line
`pdlab dp rank ready: {json}` (its HTTP URL, control endpoint, publishers), and stops on
SIGTERM/SIGINT/SIGHUP or when the launcher's process is gone.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import zmq

from cluster.engines.torch.config import EngineConfig, ModelConfig
from cluster.engines.torch.dp_scheduler import RankScheduler
from cluster.engines.torch.engine import TorchEngine
from cluster.engines.torch.expert_parallel import EPComm, ExpertPlacement
from cluster.engines.torch.rank_log import RankLog

READY = "pdlab dp rank ready:"


@dataclass(frozen=True, slots=True)
class RankSpec:
    """Everything one rank process needs (JSON on its command line)."""

    engine: dict[str, Any]  # EngineConfig fields, the model as a ModelConfig dict
    dp_rank: int
    dp_size: int
    ep_size: int
    init_file: str  # torch.distributed FileStore rendezvous
    coordinator: str  # the coordinator's ZMQ PULL endpoint
    role: str = "null"
    host: str = "127.0.0.1"
    log_dir: str | None = None
    sync_interval: int = 32
    parent_pid: int | None = None
    collective_timeout_s: float = 60.0
    options: dict[str, Any] = field(default_factory=dict)  # ShellOptions

    def engine_config(self) -> EngineConfig:
        doc = dict(self.engine)
        doc["model"] = ModelConfig(**doc["model"])
        return EngineConfig(**doc)


class RankGroup:
    """This rank's link to its group: collectives and the coordinator (module docstring)."""

    def __init__(self, spec: RankSpec, device: str) -> None:
        self.dp_rank = spec.dp_rank
        self.sync_interval = spec.sync_interval
        self.lockstep = spec.ep_size > 1
        cuda = device.startswith("cuda")
        dist.init_process_group(
            "nccl" if cuda else "gloo", init_method=f"file://{spec.init_file}",
            rank=spec.dp_rank, world_size=spec.dp_size,
            timeout=timedelta(seconds=spec.collective_timeout_s),
        )  # fmt: skip
        self.cpu_group = dist.new_group(backend="gloo") if cuda else None
        self._ctx = zmq.Context()
        self._push = self._ctx.socket(zmq.PUSH)
        self._push.setsockopt(zmq.LINGER, 500)
        self._push.connect(spec.coordinator)
        self._pull = self._ctx.socket(zmq.PULL)
        port = self._pull.bind_to_random_port(f"tcp://{spec.host}")
        self.control = f"tcp://{spec.host}:{port}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def any_unfinished(self, local: bool) -> bool:
        flag = torch.tensor([int(local)], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.cpu_group)
        return bool(flag.item())

    def notify(self, msg: dict[str, Any]) -> None:
        self._push.send_json(msg)

    def listen(self, scheduler: RankScheduler) -> None:
        """Take START_DP_WAVE messages on a thread until `close`."""

        def run() -> None:
            while not self._stop.is_set():
                if self._pull.poll(100):
                    msg = self._pull.recv_json()
                    if isinstance(msg, dict) and msg.get("type") == "start_wave":
                        scheduler.start_wave(int(msg["wave"]))

        self._thread = threading.Thread(target=run, name="dp-rank-control", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1.0)
        self._push.close()
        self._pull.close()
        self._ctx.term()


class RankEngine(TorchEngine):
    """A torch engine whose scheduler is one rank of a DP group."""

    def __init__(self, spec: RankSpec, group: RankGroup, **kw: Any) -> None:
        super().__init__(spec.engine_config(), spec.role, **kw)  # type: ignore[arg-type]
        self.spec = spec
        self.group = group
        if spec.ep_size > 1:
            placement = ExpertPlacement(self.config.model.num_experts, spec.ep_size, spec.dp_rank)
            self.runner.shard(EPComm(placement, None))

    def _build_scheduler(self) -> RankScheduler:
        self.config = replace(
            self.config,
            worker_id=self.config.worker_id or f"torch-dp{self.spec.dp_rank}-{self.port}",
        )
        lg = None
        if self.spec.log_dir:
            lg = RankLog(self.spec.log_dir, self.spec.dp_rank, self.config.worker_id)
        return RankScheduler(
            self.config, self.role, self.runner, rooms=self.rooms, kv_publisher=self.kv_publisher,
            fpm_publisher=self.fpm_publisher, link=self.group, rank_log=lg,
        )  # fmt: skip

    def healthy(self) -> bool:
        sched = self.sched
        return sched.alive and getattr(sched, "broken", None) is None

    def server_info(self) -> dict[str, Any]:
        info = super().server_info()
        sched = self.sched
        assert isinstance(sched, RankScheduler)
        state = info["internal_states"][0]
        state |= {"dp_rank": self.spec.dp_rank, "current_wave": sched.current_wave,
                  "engines_running": sched.engines_running,
                  "num_dummy_passes": sched.num_dummy_passes}  # fmt: skip
        placement = self.runner.model.placement
        info |= {"dp_rank": self.spec.dp_rank, "dp_size": self.spec.dp_size,
                 "ep_size": self.spec.ep_size,
                 "local_experts": list(placement.owned()) if placement else None}  # fmt: skip
        return info


def main(argv: list[str] | None = None) -> None:
    spec = RankSpec(**json.loads((argv or sys.argv[1:])[0]))
    device = str(spec.engine.get("device", "cpu"))
    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.set_device(spec.dp_rank % torch.cuda.device_count())
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    group = RankGroup(spec, device)
    engine = RankEngine(spec, group, host=spec.host, port=0, **spec.options)
    endpoints = engine.start()
    assert isinstance(engine.sched, RankScheduler)
    group.listen(engine.sched)
    ready = {"dp_rank": spec.dp_rank, "control": group.control, "pid": os.getpid(),
             **endpoints._asdict()}  # fmt: skip
    print(f"{READY} {json.dumps(ready)}", flush=True)
    try:
        while not stop.wait(0.1):
            if spec.parent_pid is not None and os.getppid() != spec.parent_pid:
                break  # the launcher is gone
    finally:
        engine.stop()
        group.close()
        sys.stdout.flush()
        # A peer may still wait in a collective with this rank: leave without the process
        # group's teardown (the peer's gloo sees the closed connection and fails its pass).
        os._exit(0)


if __name__ == "__main__":
    main()
