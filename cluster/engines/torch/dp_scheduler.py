"""One DP rank's scheduling loop in a DP×EP group: vLLM's DPEngineCoreProc busy loop.

The ranks of a group run their MoE layers' dispatch/combine together, so they must run
the same number of forward passes. As vLLM V1 does (`vllm/v1/engine/core.py`,
`DPEngineCoreProc.run_busy_loop`, `_has_global_unfinished_reqs`, `execute_dummy_batch`):

- the group is either paused or running a *wave*. A paused rank with nothing to do blocks;
  a rank that takes a request while paused starts running and tells the coordinator
  (`start_wave` with its wave number), which relays START_DP_WAVE to the other ranks; a
  rank ignores a start for a wave it has already finished;
- while running, every loop iteration is one pass: a real pass when the rank has a
  schedulable batch, else a dummy pass (one token through every layer) so the collectives
  of the busy ranks find a partner;
- after each pass the step counter grows; every `sync_interval` steps (vLLM: 32) the ranks
  all-reduce "has unfinished requests" over a CPU (gloo) group; when no rank has any, the
  wave ends on every rank at the same step: the wave number grows and the counter resets.

Each rank also reports its (waiting, running) counts to the coordinator when they change
(vLLM's `_maybe_publish_request_counts`), which the front end balances on. Every pass is
logged (`rank_log`) with its wave and step, so the lockstep can be checked afterwards.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from cluster.engines.torch.pass_metrics import PrefillSlice
from cluster.engines.torch.rank_log import RankLog
from cluster.engines.torch.request import EngineRequest
from cluster.engines.torch.runner import PassOutput
from cluster.engines.torch.scheduler import Scheduler

log = logging.getLogger(__name__)


class RankLink(Protocol):
    """What a rank's loop needs of its group (`dp_rank.RankGroup`)."""

    dp_rank: int
    sync_interval: int
    lockstep: bool  # the ranks' passes share collectives (expert parallelism)

    def any_unfinished(self, local: bool) -> bool: ...  # all-reduce over the DP group

    def notify(self, msg: dict[str, Any]) -> None: ...  # to the coordinator


class RankScheduler(Scheduler):
    """The torch scheduler of one DP rank (module docstring)."""

    def __init__(self, *args: Any, link: RankLink, rank_log: RankLog | None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.link = link
        self.rank_log = rank_log
        self.engines_running = False
        self.current_wave = 0
        self.step_counter = 0
        self.num_dummy_passes = 0
        self.broken: str | None = None  # a collective failed: the group cannot go on
        self._wave_starts: list[int] = []
        self._counts: tuple[int, int] | None = None
        self._pass_id = 0
        self._iters = {"prefill": 0, "decode": 0, "dummy": 0}
        self._reqs: dict[str, dict[str, Any]] = {}
        self._arrived: dict[str, float] = {}  # rid -> when `submit` handed it in

    # ---- from the coordinator and the HTTP server (any thread) -------------------------------
    def submit(self, req: EngineRequest) -> None:
        if self.broken is not None:  # nobody would run it
            req.on_update([], {"type": "abort", "message": f"DP group is broken: {self.broken}",
                               "status_code": 503})  # fmt: skip
            return
        with self._cond:  # the engine's arrival (vLLM's request arrival at the engine core)
            self._arrived[req.rid] = time.monotonic()
        super().submit(req)

    def abort(self, req: EngineRequest) -> None:
        with self._cond:
            self._arrived.pop(req.rid, None)
        super().abort(req)

    def start_wave(self, wave: int) -> None:
        """START_DP_WAVE: run wave `wave` unless this rank has finished it already."""
        with self._cond:
            self._wave_starts.append(wave)
            self._cond.notify_all()

    # ---- loop ---------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._cond:
                self._take_inbox()
                calls = list(self._calls)
                self._calls.clear()
                for wave in self._wave_starts:
                    if wave >= self.current_wave:
                        self.current_wave = wave
                        self.engines_running = True
                self._wave_starts.clear()
                local = bool(self.waiting or self.running)
                if not calls and not local and not self.engines_running:
                    self._publish_counts()
                    self._heartbeat.beat()
                    self._flush_log()
                    self._cond.wait(0.2)
                    continue
            self._run_calls(calls)
            if not self.link.lockstep:  # plain DP (no expert parallelism): no collectives
                if local and not self._step():
                    with self._cond:
                        self._cond.wait(0.01)
                self._publish_kv_events()
                self._publish_counts()
                self._flush_log()
                continue
            if local and not self.engines_running:
                self.engines_running = True
                self.link.notify({"type": "start_wave", "wave": self.current_wave,
                                  "rank": self.link.dp_rank})  # fmt: skip
            if not self.engines_running:
                continue
            try:
                if not (local and self._step()):
                    self._dummy_pass()
                self.engines_running = self._global_unfinished()
            except Exception as e:  # a pass or a collective failed: the group is broken
                log.exception("DP rank %d: pass failed", self.link.dp_rank)
                self.broken = f"{type(e).__name__}: {e}"
                self._fail_all(f"engine pass failed: {self.broken}")
                break
            self._publish_kv_events()
            self._publish_counts()
            if not self.engines_running:
                if self.link.dp_rank == 0:
                    self.link.notify({"type": "wave_complete", "wave": self.current_wave})
                self.current_wave += 1
                self.step_counter = 0
            self._flush_log()
        self._flush_log(force=True)

    def _run_calls(self, calls: list[tuple[Callable[[], Any], Any]]) -> None:
        for fn, fut in calls:
            try:
                fut.set_result(fn())
            except Exception as e:  # the caller gets the error; the loop goes on
                fut.set_exception(e)

    def _global_unfinished(self) -> bool:
        """vLLM's `_has_global_unfinished_reqs`: an all-reduce every `sync_interval` steps."""
        self.step_counter += 1
        if self.step_counter % self.link.sync_interval:
            return True
        return self.link.any_unfinished(bool(self.waiting or self.running or self._inbox))

    def _dummy_pass(self) -> None:
        t_start = time.monotonic()
        out = self.runner.dummy_run()
        self.num_dummy_passes += 1
        self._on_pass("dummy", t_start, out, [], [])

    def _publish_counts(self) -> None:
        counts = (len(self.waiting), len(self.running))
        if counts != self._counts:
            self._counts = counts
            self.link.notify({"type": "counts", "rank": self.link.dp_rank, "waiting": counts[0],
                              "running": counts[1], "wave": self.current_wave})  # fmt: skip

    # ---- logging ------------------------------------------------------------------------------
    def _take_inbox(self) -> None:
        now = time.monotonic()
        for req in self._inbox:
            self._reqs[req.rid] = {"t_arrival": self._arrived.pop(req.rid, now), "t_queued": now,
                                   "t_prefill_start": None, "t_first_token": None}  # fmt: skip
        super()._take_inbox()

    def _on_pass(
        self,
        phase: str,
        t_start: float,
        out: PassOutput,
        reqs: list[EngineRequest],
        detail: list[PrefillSlice] | list[int],
    ) -> None:
        self._pass_id += 1
        self._iters[phase] += 1
        if phase == "prefill":
            for req in reqs:
                info = self._reqs.get(req.rid)
                if info is not None and info["t_prefill_start"] is None:
                    info["t_prefill_start"] = t_start
        lg = self.rank_log
        if lg is None:
            return
        e = out.experts_per_layer
        row: dict[str, Any] = {
            "pass_id": self._pass_id, "wave": self.current_wave, "step": self.step_counter + 1,
            "kind": phase, "iter_id": self._iters[phase], "t_start": t_start,
            "duration_s": out.wall_s, "experts_active": sum(e) / len(e) if e else None,
        }  # fmt: skip
        if phase == "prefill":
            slices = [s for s in detail if isinstance(s, PrefillSlice)]
            row |= {"num_reqs": len(slices), "t_uc": sum(s.t_uc for s in slices),
                    "t_c": sum(s.t_c for s in slices), "t_rst": sum(s.t_rst for s in slices),
                    "attn_pairs": out.attn_pairs}  # fmt: skip
        elif phase == "decode":
            lens = [int(n) for n in detail if isinstance(n, int)]
            row |= {"batch_size": len(lens), "ctx_tokens": sum(lens)}
        lg.add("pass", **row)
        for layer, load in enumerate(out.layer_loads):
            lg.add("layer", pass_id=self._pass_id, layer=layer, tokens_in=load.tokens_in,
                   tokens_received=load.tokens_received,
                   experts_activated=load.experts_activated, comm_s=load.comm_s)  # fmt: skip

    def _progress(self, req: EngineRequest, now: float) -> None:
        info = self._reqs.get(req.rid)
        if info is not None and info["t_first_token"] is None:
            info["t_first_token"] = now
        super()._progress(req, now)

    def _finish(self, req: EngineRequest, finish: dict[str, Any], now: float) -> None:
        info = self._reqs.pop(req.rid, None)
        if info is not None and self.rank_log is not None:
            self.rank_log.add("request", rid=req.rid, **info, t_done=now,
                              t_in=len(req.input_ids), t_c=req.cached_tokens,
                              t_out=len(req.output_ids), finish=finish.get("type"))  # fmt: skip
        super()._finish(req, finish, now)

    def _flush_log(self, force: bool = False) -> None:
        if self.rank_log is not None:
            self.rank_log.flush() if force else self.rank_log.maybe_flush()
