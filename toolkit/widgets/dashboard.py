"""The cluster dashboard widget (SPEC §7): node cards, live plots and controls over REST.

Paper 000 §4.2 lets an operator switch a node's phase without relaunching it; this widget is
that operator's panel over `pdlab serve` (SPEC §6): a card per node (phase, queue, running
requests, KV used in GPU and host memory) with a switch button, the PD split and rolling
latency over time, the planner's mode (auto / advise / off) with its latest candidate gains
(Eq. 6) and an "apply recommended split" button, and the router policy and copy price κ
(Eq. 7). Every server error lands in the status line, never as a traceback; so does a run
the server stopped after a failure. A badge shows when the paced cluster falls behind the
wall clock by more than `lag_warn_s` wall seconds (health's `lag_s`: the simulator cannot
keep the requested speed on this machine). A background thread refreshes it every
`refresh_s` seconds (`start()` / `stop()`); `refresh()` runs one update synchronously (tests,
notebooks executed headless). The plots are filled from the whole timeline
(`GET /v1/timeline`) and the planner's last evaluation on every refresh and shown as
widget state (live_plot.LivePlot), so every view of them, one drawn later included (a cell
scrolled back into view, a reopened notebook), draws them as they are. Time axes name the
cluster's clock (simulated, or wall time for real engines); a switch the status line
announced is reported done once its nodes serve their new phase. Below, where the run's
database is readable here, each node's prefill and decode passes of a recent window with
the requests in each (pass_timeline.PassTimelineView).
"""

from __future__ import annotations

import html
import threading
from collections.abc import Callable
from typing import Any

import ipywidgets as w

from toolkit.client import PdlabApiError, PdlabClient
from toolkit.widgets import figures
from toolkit.widgets.live_plot import LivePlot
from toolkit.widgets.pass_timeline import PassTimelineView

_PHASE_COLORS = {"prefill": figures.PREFILL_COLOR, "decode": figures.DECODE_COLOR}


def _other(phase: str) -> str:
    return "decode" if phase == "prefill" else "prefill"


def _pct(used: float, cap: float) -> str:
    return f"{100.0 * used / cap:.0f}%" if cap else "-"


def _fmt_s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} s"


def _shadow_text(shadow: dict[str, Any] | None) -> str:
    """The recommendations of an attached fleet (`pdlab attach`), which nothing acts on."""
    if not shadow:
        return ""
    r, p = shadow.get("router") or {}, shadow.get("planner") or {}
    if "node" in r:
        ttft = r.get("predicted_ttft_s")
        route = (
            f"a {r['prompt_tokens']}-token request → <b>node {r['node']}</b> "
            f"(predicted TTFT {_fmt_s(ttft)}, {html.escape(str(r['policy']))})"
        )
    else:
        route = html.escape(str(r.get("note", "-")))
    if "t" in p:
        rec = p.get("recommended_split")
        gain = p.get("best_mean_gain_rps")
        gain_s = (
            ""
            if gain is None
            else f", best gain {gain:+.2f} ± {p.get('best_std_gain_rps') or 0:.2f} req/s"
        )
        plan = (
            f"t={p['t']:.0f} s: <b>{'recommend ' + rec if rec else 'keep ' + p['current_split']}</b>"
            + ("" if not p.get("switches") else " (" + ", ".join(
                f"node {m['node']} → {m['to_phase']}" for m in p["switches"]) + ")")
            + gain_s
        )  # fmt: skip
    else:
        plan = html.escape(str(p.get("note", "-")))
    return (
        "<div style='background:#eef3fb;border-left:4px solid #3b6fb6;padding:4px 8px;"
        "margin:4px 0'><b>shadow mode</b>: pdlab recommends, the fleet's own router acts "
        f"(nothing switches unless asked)<br>router: {route}<br>planner "
        f"({html.escape(str(p.get('name', '')))}, {p.get('mode', '')}): {plan}</div>"
    )


def _kv_line(n: dict[str, Any], phase: str) -> str:
    """What a node's KV holds. A prefill node's GPU KV is its prefix cache, full by design
    (cached prefixes stay until evicted): its share says how much is cached, not pressure."""
    gpu = _pct(n["kv_gpu_used"], n["kv_gpu_capacity"])
    host = _pct(n["kv_host_used"], n["kv_host_capacity"])
    if phase == "prefill":
        return f"GPU prefix cache {gpu} full (evictable) · host {host}"
    return f"KV GPU {gpu} · host {host}"


class NodeCard:
    """One node: a status block and a button switching it to the other phase."""

    def __init__(self, node_id: int, on_switch: Callable[[int], object]) -> None:
        self.node_id = node_id
        self.info = w.HTML()
        self.button = w.Button(layout=w.Layout(width="auto"))
        self.button.add_class("pdlab-switch")
        self.button.add_class(f"pdlab-switch-{node_id}")
        self.button.on_click(lambda _b: on_switch(node_id))
        self.box = w.VBox(
            [self.info, self.button],
            layout=w.Layout(border="1px solid #ccc", padding="6px", margin="2px", width="235px"),
        )
        self.box.add_class("pdlab-node-card")

    def update(self, n: dict[str, Any]) -> None:
        phase = n["phase"]
        sw = n["switching"]
        color = _PHASE_COLORS.get(phase, "#777")
        state = (
            f"switching → {sw['to_phase']} ({sw['trigger']})"
            if sw
            else ("out of service" if n["out_of_service"] else "serving")
        )
        self.info.value = (
            f"<b>node {n['id']}</b> "
            f"<span style='color:white;background:{color};padding:1px 5px;border-radius:3px'>"
            f"{phase}</span><br><small>{html.escape(state)}</small><br>"
            f"queue {n['queue']} · running {n['running']}<br>"
            f"<small>{_kv_line(n, phase)}</small>"
        )
        target = _other(phase)
        self.button.description = (
            f"node {n['id']} switching → {sw['to_phase']}"
            if sw
            else f"switch node {n['id']} → {target}"
        )
        self.button.disabled = sw is not None
        self.button.button_style = "" if sw else "warning"
        refusal = n.get("switch_refusal")  # an attached engine that cannot switch in place
        if refusal:
            self.button.disabled = True
            self.button.description = f"node {n['id']}: no in-place switch"
            self.button.tooltip = refusal
            self.info.value += f"<br><small>{html.escape(str(n.get('kind', '')))} engine</small>"


class ClusterDashboard:
    """See module docstring. `ClusterDashboard(url, token)`; show it with `.display()`."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        refresh_s: float = 2.0,
        client: PdlabClient | None = None,
        lag_warn_s: float = 2.0,
        timeline: bool = True,
    ) -> None:
        if client is None:
            env = PdlabClient.from_env()
            client = PdlabClient(url or env.url, token if token is not None else env.token)
        self.client = client
        self.refresh_s = refresh_s
        self.lag_warn_s = lag_warn_s
        self.last_error: str | None = None
        self.last_message: str | None = None
        self.state: dict[str, Any] | None = None
        self.planner_state: dict[str, Any] | None = None
        self.health: dict[str, Any] | None = None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._syncing = False  # set while refresh writes control values (no callbacks)
        self.cards: dict[int, NodeCard] = {}
        # A switch the status line announced, until its nodes serve their new phase:
        # (the message shown, node -> phase it goes to, what to say when done)
        self._pending: tuple[str, dict[int, str], str] | None = None
        self.simulated = True  # the cluster's clock: simulated, or wall time (real engines)

        self.header = w.HTML()
        self.lag_badge = w.HTML()
        self.lag_badge.add_class("pdlab-lag")
        self.status = w.HTML()
        self.status.add_class("pdlab-status")
        self.cards_box = w.HBox(layout=w.Layout(flex_flow="row wrap"))
        self.split_fig = figures.split_figure()
        self.latency_fig = figures.latency_figure()
        self.gains_fig = figures.gains_figure()
        self.split_plot = LivePlot(self.split_fig)
        self.latency_plot = LivePlot(self.latency_fig)
        self.gains_plot = LivePlot(self.gains_fig)
        self.timeline = PassTimelineView() if timeline else None
        self.mode = w.ToggleButtons(options=["auto", "advise", "off"], description="planner")
        self.mode.observe(self._on_mode, names="value")
        self.apply_button = w.Button(
            description="apply recommended split",
            button_style="success",
            layout=w.Layout(width="auto", min_width="210px"),
        )
        self.apply_button.add_class("pdlab-apply")
        self.apply_button.on_click(lambda _b: self.apply_recommended())
        self.recommendation = w.HTML()
        self.shadow = w.HTML()  # an attached fleet: what pdlab would do, never does
        self.shadow.add_class("pdlab-shadow")
        self.policy = w.Dropdown(description="router", options=[])
        self.copy_price = w.FloatText(description="κ (s/token)", step=1e-7)
        self.router_button = w.Button(description="set router")
        self.router_button.on_click(
            lambda _b: self.set_router(self.policy.value, self.copy_price.value)
        )
        self.widget = w.VBox(
            [
                w.HBox([self.header, self.lag_badge]),
                self.shadow,
                self.status,
                self.cards_box,
                w.HBox([self.split_plot, self.latency_plot]),
                w.HBox([self.mode, self.apply_button]),
                self.recommendation,
                self.gains_plot,
                w.HBox([self.policy, self.copy_price, self.router_button]),
                *([self.timeline.widget] if self.timeline is not None else []),
            ]
        )
        self.widget.add_class("pdlab-dashboard")

    # ---- display and refresh loop -----------------------------------------------------------
    def display(self, autorefresh: bool = True) -> None:
        from IPython.display import display

        self.refresh()
        display(self.widget)
        if autorefresh:
            self.start()

    def _ipython_display_(self) -> None:
        self.display()

    def start(self) -> None:
        """Refresh every `refresh_s` seconds in a background thread until `stop()`."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="pdlab-dashboard", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.refresh_s):
            self.refresh()

    def refresh(self) -> bool:
        """Fetch health, the cluster, its whole timeline and the planner state and redraw;
        False on a server error."""
        with self._lock:
            try:
                health = self.client.health()
                state = self.client.cluster()
                timeline = self.client.timeline()
                planner = self.client.planner()
            except PdlabApiError as err:
                self._error(f"cannot refresh: {err}")
                return False
            self.health, self.state, self.planner_state = health, state, planner
            # A paced simulation reports its lag; real engines name their source.
            self.simulated = "lag_s" in health and state.get("source") is None
            self._draw(state, timeline, planner)
            self._check_pending(state)
            if self.timeline is not None and health.get("run_id"):
                self.timeline.update(health.get("db"), str(health["run_id"]), float(state["time"]))
            if self.last_error and self.last_error.startswith("cannot refresh"):
                self._clear_error()
            self._draw_health(health)
            return True

    def _draw_health(self, health: dict[str, Any]) -> None:
        lag_s = float(health.get("lag_s") or 0.0)  # simulated seconds behind
        speed = float(health.get("speed") or 1.0)
        if lag_s / speed > self.lag_warn_s:
            self.lag_badge.value = (
                "<span style='background:#e65100;color:white;padding:2px 6px;"
                "border-radius:3px;margin-left:8px'>"
                f"⚠ lag: {lag_s:.0f} simulated s behind the wall clock ({lag_s / speed:.1f} s "
                f"at {speed:g}×): the simulator cannot keep this speed here</span>"
            )
        else:
            self.lag_badge.value = ""
        if health.get("status") == "error":
            self._error(f"the run stopped after a failure: {health.get('error')}")

    def _draw(self, s: dict[str, Any], timeline: dict[str, Any], planner: dict[str, Any]) -> None:
        lat = s["latency"]
        self.header.value = (
            f"<b>run {html.escape(str(s['run_id']))}</b> · t = {s['time']:.0f} s "
            f"({s['speed']:g}×{', ended' if s['finished'] else ''}) · split "
            f"<b>{s['split']['prefill']}P{s['split']['decode']}D</b> · "
            f"{s['requests_completed']} requests done · {s['switches']} switches · "
            f"TTFT p50 {_fmt_s(lat['ttft_p50_s'])} · E2E p50 {_fmt_s(lat['e2e_p50_s'])}"
        )
        ids = [n["id"] for n in s["nodes"]]
        if list(self.cards) != ids:
            self.cards = {i: NodeCard(i, self.switch_node) for i in ids}
            self.cards_box.children = [c.box for c in self.cards.values()]
        for n in s["nodes"]:
            self.cards[n["id"]].update(n)
        for fig in (self.split_fig, self.latency_fig):
            figures.time_axis(fig, self.simulated)
        figures.update_split(self.split_fig, timeline["split"], timeline["time"])
        figures.update_latency(self.latency_fig, timeline["samples"])
        decision = planner.get("last_decision")
        figures.update_gains(self.gains_fig, decision)
        for plot in (self.split_plot, self.latency_plot, self.gains_plot):
            plot.redraw()
        self.recommendation.value = self._recommendation_text(planner, decision)
        self.shadow.value = _shadow_text(s.get("shadow")) if s.get("mode") == "shadow" else ""
        self._syncing = True
        try:
            modes = list(planner.get("modes") or self.mode.options)
            if list(self.mode.options) != modes:
                self.mode.options = modes
            self.mode.value = planner["mode"]
            router = s["router"]
            if list(self.policy.options) != router["policies"]:
                self.policy.options = router["policies"]
            self.policy.value = router["policy"]
            self.copy_price.value = router["copy_price"]
        finally:
            self._syncing = False

    @staticmethod
    def _recommendation_text(planner: dict[str, Any], d: dict[str, Any] | None) -> str:
        head = f"planner <b>{html.escape(planner['name'])}</b>, mode {planner['mode']}"
        if planner.get("window_s"):
            head += f", window {planner['window_s']:g} s / {planner['slices']} slices"
        if d is None:
            return head + " · no evaluation yet"
        if d["chosen_prefill"] is None:
            return (
                head + f" · t={d['t']:.0f} s: no candidate qualified; keep {d['current_prefill']}P"
            )
        moves = ", ".join(f"node {m['node']} → {m['to_phase']}" for m in d["switches"])
        return head + (
            f" · t={d['t']:.0f} s: recommended {d['chosen_prefill']}P "
            f"(from {d['current_prefill']}P: {moves})"
        )

    def _check_pending(self, s: dict[str, Any]) -> None:
        """Once every node of the announced switch serves its new phase, say so (the status
        line must not keep saying "switching" after the switch finished)."""
        if self._pending is None:
            return
        shown, moves, done = self._pending
        nodes = {n["id"]: n for n in s["nodes"]}
        if all(
            i in nodes and nodes[i]["switching"] is None and nodes[i]["phase"] == phase
            for i, phase in moves.items()
        ):
            self._pending = None
            if self.last_error is None and self.last_message == shown:
                self._ok(f"{done} at t ≈ {s['time']:.1f} s")

    # ---- status line ----------------------------------------------------------------------------
    def _error(self, message: str) -> None:
        self.last_error = message
        self.status.value = (
            f"<div style='color:#b00020;font-weight:bold'>⚠ {html.escape(message)}</div>"
        )

    def _ok(self, message: str) -> None:
        self.last_error = None
        self.last_message = message
        self.status.value = f"<div style='color:#1b5e20'>✓ {html.escape(message)}</div>"

    def _clear_error(self) -> None:
        self.last_error = None
        self.status.value = ""

    def _act(self, what: str, call: Callable[[], Any]) -> Any:
        """Run a mutating call; a refusal goes to the status line (returns None)."""
        with self._lock:
            try:
                out = call()
            except PdlabApiError as err:
                self._error(f"{what}: {err}")
                return None
            self.refresh()
            return out

    # ---- controls ---------------------------------------------------------------------------
    def switch_node(self, node_id: int, phase: str | None = None) -> dict[str, Any] | None:
        """Switch `node_id` to `phase` (default: the other phase than the one it serves)."""
        if phase is None:
            card = self.state and next((n for n in self.state["nodes"] if n["id"] == node_id), None)
            phase = _other(card["phase"]) if card else "decode"
        out = self._act(
            f"switch node {node_id} → {phase}", lambda: self.client.switch(node_id, phase)
        )
        if out is not None:
            what = f"node {node_id}: {out['from_phase']} → {out['to_phase']}"
            message = f"{what} decided at t={out['t_decided']:.1f} s ({out['status']})"
            self._ok(message)
            if out["status"] != "done":
                self._pending = (message, {node_id: out["to_phase"]}, f"{what} done")
                if self.state is not None:
                    self._check_pending(self.state)
        return out

    def _on_mode(self, change: dict[str, Any]) -> None:
        if not self._syncing:
            self.set_planner_mode(change["new"])

    def set_planner_mode(self, mode: str) -> dict[str, Any] | None:
        out = self._act(f"planner mode {mode}", lambda: self.client.set_planner(mode=mode))
        if out is not None:
            self._ok(f"planner mode {out['mode']}")
        return out

    def apply_recommended(self) -> dict[str, Any] | None:
        out = self._act("apply recommended split", self.client.apply_planner)
        if out is not None:
            d = out["decision"]
            nodes = ", ".join(map(str, out["started"]))
            message = f"applying {d['chosen_prefill']}P: switching node(s) {nodes}"
            self._ok(message)
            moves = {m["node"]: m["to_phase"] for m in d["switches"] if m["node"] in out["started"]}
            if moves:
                self._pending = (message, moves, f"applied {d['chosen_prefill']}P: node(s) {nodes}")
                if self.state is not None:
                    self._check_pending(self.state)
        return out

    def set_router(
        self, policy: str | None, copy_price: float | None = None
    ) -> dict[str, Any] | None:
        out = self._act(
            f"router {policy}", lambda: self.client.set_router(policy=policy, copy_price=copy_price)
        )
        if out is not None:
            self._ok(f"router {out['policy']}, copy price {out['copy_price']:g} s/token")
        return out
