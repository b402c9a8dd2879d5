"""Phase switches of live SGLang engines (paper 000 §4.1–4.2, SPEC §4 "Phase switch").

The control plane decides a switch (planner or REST) and marks the node unavailable, so the
proxy routes nothing new to it. `RoleSwitcher` then, on a thread of its own:

1. drains: waits until the proxy has no request in flight on the node (SGLang cannot move
   a dispatched request, so queued ones finish in place too; `drained` counts them);
2. notes the KV the switch loses: the blocks the directory says the node holds (SGLang's
   role switch releases the prefix cache, publishing AllBlocksCleared), or none when the
   engine's /server_info says `pd_role_switch_keeps_cache` (the torch engine keeps its
   cache in place, as paper 000 §4.1's symmetric engines do);
3. `POST /pd_role_switch {"new_role": ...}` (SGLang 0.5.23, engines started with
   `--enable-pd-role-switch`), retrying while the engine says it is not idle; a first flip
   to decode carries `decode_cuda_graph_memory_gb` (and `decode_cuda_graph_bs`) measured on
   a decode peer (its /server_info internal state), else the cluster file's value;
4. verifies through /server_info that the engine serves the new role and re-reads its
   bootstrap port;
5. resumes: `ControlPlane.complete_switch` (the `phase_switches` row), routing to the node
   again.

Where role switch is unavailable (the flag is not set, or an SGLang without the route), a
user-provided relaunch command (the cluster file's `relaunch_command`: a shell command whose
{role}, {node_id}, {http_url}, {host} and {port} are filled in shell-quoted, so write them
unquoted) restarts the engine in the new role; the switcher waits until /server_info shows it, resubscribes the collectors and completes the
switch in "relaunch" mode (the node's directory entries are dropped). Each switch leaves a
`SwitchRecord` with its duration and the KV it lost. A switch that cannot be done is given
up with a clear message and the node serves its old phase again.
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import tempfile
import threading
import time
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

import httpx

from cluster.control import SwitchMode
from cluster.core import Phase
from cluster.live.cluster_file import EngineSpec, merge_discovered, spec_from_server_info

if TYPE_CHECKING:
    from cluster.control import PendingSwitch
    from cluster.live.cluster_file import ClusterSettings

log = logging.getLogger(__name__)


class SwitchFailed(RuntimeError):
    """A phase switch that could not be carried out; the message says why."""


@dataclass(frozen=True, slots=True)
class SwitchRecord:
    """One switch: decision and completion (run seconds), drain, lost KV, how it was done."""

    node_id: int
    from_phase: str
    to_phase: str
    trigger: str
    t_decided: float
    t_done: float
    drained: int  # requests in flight on the node when the switch was decided
    lost_kv_blocks: int  # blocks the node held when the switch released its cache
    lost_kv_tokens: int
    method: str  # "role-switch" | "relaunch" | "none" (failed before either)
    ok: bool
    message: str = ""

    @property
    def switch_s(self) -> float:
        return self.t_done - self.t_decided

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"switch_s": self.switch_s}


def _role_of(info: dict[str, Any]) -> str:
    states = info.get("internal_states") or []
    if states and isinstance(states[0], dict) and states[0].get("disaggregation_mode"):
        return str(states[0]["disaggregation_mode"])
    return str(info.get("disaggregation_mode") or "null")


class SwitchHost(Protocol):
    """What a `RoleSwitcher` needs of its cluster: the port it switches through.

    `SGLangCluster` implements it (its queries in switch_queries.py); the switcher reaches
    nothing else of the cluster (not its proxy, fleet or control plane)."""

    @property
    def settings(self) -> ClusterSettings: ...  # timeouts, relaunch command, graph memory

    @property
    def lock(self) -> AbstractContextManager[Any]: ...  # the control plane's lock

    @property
    def finished(self) -> bool: ...

    def now(self) -> float: ...

    def engine(self, node: int) -> EngineSpec: ...

    def config_engine(self, node: int) -> EngineSpec: ...

    def engine_headers(self) -> dict[str, str]: ...

    def requests_on(self, node: int) -> int: ...

    def pending_switch(self, node: int) -> PendingSwitch | None: ...

    def held_blocks(self, node: int) -> int: ...

    def block_tokens(self) -> int: ...

    def decode_peers(self, node: int) -> list[str]: ...

    def mark_down(self, node: int, reason: str) -> None: ...

    def set_relaunching(self, node: int, relaunching: bool) -> None: ...

    def restart_collectors(self, node: int, spec: EngineSpec) -> None: ...

    def on_switched(self, rec: SwitchRecord, spec: EngineSpec | None) -> None: ...


class RoleSwitcher:
    """Carries out the switches `SGLangCluster.begin_switch` hands it (module docstring)."""

    def __init__(self, cluster: SwitchHost) -> None:
        self.cluster = cluster
        self._threads: dict[int, threading.Thread] = {}
        self.poll_s = 0.02

    def begin(self, node: int, to_phase: Phase, mode: SwitchMode, now: float) -> None:
        """Called under the control-plane lock by `ControlPlane.request_switch`."""
        c = self.cluster
        sw = c.pending_switch(node)
        assert sw is not None, f"begin_switch of node {node} without a pending switch"
        drained = c.requests_on(node)
        log.info(
            "switching engine %d %s -> %s (%s, %d requests to drain)",
            node,
            sw.from_phase,
            to_phase,
            sw.trigger,
            drained,
        )
        t = threading.Thread(
            target=self._run,
            args=(node, sw.from_phase, to_phase, sw.trigger, now, drained),
            name=f"pdlab-switch-{node}",
            daemon=True,
        )
        self._threads[node] = t
        t.start()

    def join(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for t in list(self._threads.values()):
            t.join(max(0.0, deadline - time.monotonic()))

    # ---- the switch ----------------------------------------------------------------------
    def _run(
        self, node: int, from_phase: str, to_phase: str, trigger: str, t0: float, drained: int
    ) -> None:
        c = self.cluster
        lost = 0
        method = "none"
        spec: EngineSpec | None = None
        try:
            self._drain(node)
            keeps = self._keeps_cache(c.engine(node))
            with c.lock:
                lost = 0 if keeps else c.held_blocks(node)
            method, spec = self._switch(node, to_phase)
            ok, msg = True, f"{from_phase} -> {to_phase} by {method}"
        except SwitchFailed as e:
            ok, msg = False, str(e)
        except Exception as e:  # a bug here must not leave the node unavailable forever
            log.exception("phase switch of engine %d failed", node)
            ok, msg = False, f"{type(e).__name__}: {e}"
        bt = c.block_tokens()
        rec = SwitchRecord(
            node, from_phase, to_phase, trigger, t0, c.now(), drained, lost, lost * bt,
            method, ok, msg,
        )  # fmt: skip
        if ok:
            log.info(
                "engine %d now serves %s: %.2f s after the decision, %d requests drained, "
                "%d KV blocks (%d tokens) released",
                node,
                to_phase,
                rec.switch_s,
                drained,
                lost,
                lost * bt,
            )
        else:
            log.error("phase switch of engine %d given up; it keeps %s: %s", node, from_phase, msg)
        c.on_switched(rec, spec)

    def _drain(self, node: int) -> None:
        c = self.cluster
        deadline = time.monotonic() + c.settings.drain_timeout_s
        while True:
            with c.lock:
                left = c.requests_on(node)
            if left == 0:
                return
            if c.finished:
                raise SwitchFailed("the cluster is stopping")
            if time.monotonic() > deadline:
                raise SwitchFailed(
                    f"drain timed out after {c.settings.drain_timeout_s:g} s with {left} "
                    "requests still in flight"
                )
            time.sleep(self.poll_s)

    def _keeps_cache(self, spec: EngineSpec) -> bool:
        """Whether the engine's role switch keeps its prefix cache (unknown: it does not)."""
        try:
            r = httpx.get(
                f"{spec.http_url}/server_info", headers=self.cluster.engine_headers(), timeout=10.0
            )
            return bool(r.json().get("pd_role_switch_keeps_cache"))
        except (httpx.HTTPError, ValueError, AttributeError):
            return False

    def _switch(self, node: int, to_phase: str) -> tuple[str, EngineSpec]:
        c = self.cluster
        spec = c.engine(node)
        headers = c.engine_headers()
        with httpx.Client(timeout=c.settings.switch_timeout_s, headers=headers) as client:
            body: dict[str, Any] = {"new_role": to_phase}
            if to_phase == "decode":
                body |= self._graph_budget(client, node, spec)
            deadline = time.monotonic() + c.settings.switch_timeout_s
            while True:
                try:
                    r = client.post(f"{spec.http_url}/pd_role_switch", json=body)
                except httpx.HTTPError as e:
                    raise SwitchFailed(
                        f"POST {spec.http_url}/pd_role_switch failed: {type(e).__name__}: {e}"
                    ) from None
                reply = _json(r)
                msg = str(reply.get("message") or r.text[:300])
                if r.status_code == 200 and reply.get("success", True):
                    return "role-switch", self._verify(client, node, spec, to_phase)
                unsupported = r.status_code in (404, 405) or "--enable-pd-role-switch" in msg
                if unsupported:
                    return "relaunch", self._relaunch(client, node, spec, to_phase, msg)
                if "not idle" in msg and time.monotonic() < deadline:
                    time.sleep(0.1)  # a request the proxy did not send (health, direct use)
                    continue
                if reply.get("safe_to_restore") is False:
                    c.mark_down(node, f"role switch failed and left the engine unhealthy: {msg}")
                raise SwitchFailed(f"{spec.http_url}/pd_role_switch refused: {msg}")

    def _graph_budget(self, client: httpx.Client, node: int, spec: EngineSpec) -> dict[str, Any]:
        """Decode CUDA-graph footprint measured on a decode peer, else the cluster file's."""
        c = self.cluster
        with c.lock:
            peers = c.decode_peers(node)
        for url in peers:
            try:
                states = client.get(f"{url}/server_info").json().get("internal_states") or [{}]
            except (httpx.HTTPError, ValueError):
                continue
            st = states[0] if isinstance(states[0], dict) else {}
            if st.get("decode_cuda_graph_memory_gb") is not None:
                out: dict[str, Any] = {
                    "decode_cuda_graph_memory_gb": float(st["decode_cuda_graph_memory_gb"])
                }
                if st.get("decode_cuda_graph_bs"):
                    out["decode_cuda_graph_bs"] = list(st["decode_cuda_graph_bs"])
                return out
        gb = spec.decode_cuda_graph_memory_gb
        if gb is None:
            gb = c.settings.decode_cuda_graph_memory_gb
        return {} if gb is None else {"decode_cuda_graph_memory_gb": float(gb)}

    def _verify(
        self, client: httpx.Client, node: int, spec: EngineSpec, to_phase: str
    ) -> EngineSpec:
        """/server_info must report the new role; its bootstrap port may have changed."""
        try:
            info = client.get(f"{spec.http_url}/server_info").json()
        except (httpx.HTTPError, ValueError) as e:
            raise SwitchFailed(f"cannot verify the switch through /server_info: {e}") from None
        role = _role_of(info)
        if role != to_phase:
            raise SwitchFailed(
                f"/pd_role_switch answered success but /server_info reports role {role!r}"
            )
        return self._respec(spec, info)

    def _respec(self, spec: EngineSpec, info: dict[str, Any]) -> EngineSpec:
        found = spec_from_server_info(info, spec.http_url, spec.node_id)
        configured = self.cluster.config_engine(spec.node_id)
        return replace(merge_discovered(configured, found), role=found.role)

    def _relaunch(
        self, client: httpx.Client, node: int, spec: EngineSpec, to_phase: str, why: str
    ) -> EngineSpec:
        c = self.cluster
        template = spec.relaunch_command or c.settings.relaunch_command
        if not template:
            raise SwitchFailed(
                f"role switch is unavailable on {spec.http_url} ({why}) and no relaunch_command "
                "is configured; start SGLang with --enable-pd-role-switch or set "
                "relaunch_command in the cluster file"
            )
        url = urlsplit(spec.http_url)
        fields = {
            "role": to_phase,
            "node_id": node,
            "http_url": spec.http_url,
            "host": url.hostname or "",
            "port": url.port or "",
        }
        cmd = relaunch_command(template, fields)
        c.set_relaunching(node, True)
        logf = tempfile.NamedTemporaryFile(  # noqa: SIM115 - kept for the child's lifetime
            prefix=f"pdlab-relaunch-{node}-", suffix=".log", delete=False
        )
        log.info("relaunching engine %d as %s: %s (log %s)", node, to_phase, cmd, logf.name)
        proc = subprocess.Popen(
            cmd, shell=True, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + c.settings.relaunch_timeout_s
        try:
            while time.monotonic() < deadline:
                rc = proc.poll()
                if rc not in (None, 0):
                    raise SwitchFailed(
                        f"relaunch command exited with {rc}: {_tail(logf.name)} (cmd: {cmd})"
                    )
                try:
                    info = client.get(f"{spec.http_url}/server_info", timeout=2.0).json()
                except (httpx.HTTPError, ValueError):
                    info = None
                if info is not None and _role_of(info) == to_phase:
                    new = self._respec(spec, info)
                    c.restart_collectors(node, new)
                    return new
                time.sleep(0.25)
        finally:
            logf.close()
        raise SwitchFailed(
            f"engine {node} did not come back as {to_phase} within "
            f"{c.settings.relaunch_timeout_s:g} s of the relaunch command ({cmd}); "
            f"its output: {_tail(logf.name)}"
        )


def relaunch_command(template: str, fields: dict[str, Any]) -> str:
    """The shell command of `template` with `fields` filled in, each shell-quoted (a URL or
    host from a cluster file never reaches the shell as code). Raises SwitchFailed naming
    the placeholders when the template is malformed."""
    try:
        return template.format(**{k: shlex.quote(str(v)) for k, v in fields.items()})
    except (KeyError, IndexError, ValueError) as e:
        raise SwitchFailed(
            f"relaunch_command {template!r} is invalid ({e}); placeholders: "
            + ", ".join("{" + k + "}" for k in fields)
        ) from None


def _json(r: httpx.Response) -> dict[str, Any]:
    try:
        out = r.json()
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}


def _tail(path: str, n: int = 400) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - n))
            return f.read().decode("utf-8", "replace").strip() or "(no output)"
    except OSError:
        return "(no output)"


__all__ = ["RoleSwitcher", "SwitchFailed", "SwitchRecord", "relaunch_command"]
