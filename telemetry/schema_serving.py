"""Tables of live PD clusters' serving overheads (SPEC §3 additions; paper 000 §4.1).

`request_stages`: when each request a live PD proxy answered passed each stage between the
proxy and the engines; `overhead_fits`: the stages' durations of a run fitted as
distributions (models.overheads); `OVERHEAD`: the iteration tables' per-pass CPU overhead
column. `telemetry.schema` puts them into `TABLES`.
"""

from __future__ import annotations

from telemetry.columns import RUN_ID, Column
from telemetry.columns import column as _c

_S = "s"


def _stage(name: str, doc: str) -> Column:
    return _c(name, "DOUBLE", f"when {doc}, since the run's start (NULL: not reported)", _S,
              nullable=True, nonnegative=True)  # fmt: skip


OVERHEAD = _c(
    "overhead_s",
    "DOUBLE",
    "the engine loop's time around the pass outside the forward duration_s spans "
    "(scheduling, bookkeeping, answers, publishing); back-to-back passes cost duration_s + "
    "overhead_s each; NULL when the engine does not measure it",
    "s",
    nullable=True,
    nonnegative=True,
)

CPU = _c(
    "cpu_s",
    "DOUBLE",
    "CPU time of the engine thread over the pass's duration_s (pdlab's torch engine on a CPU "
    "device, one torch thread: the forward's work; duration_s - cpu_s waited for a core or "
    "the GIL); NULL when the engine does not measure it",
    _S,
    nullable=True,
    nonnegative=True,
)

SERVING_TABLES: dict[str, tuple[Column, ...]] = {
    # One row per request a live PD proxy answered: when it passed each stage of its life
    # between the proxy and the engines (paper 000 §4.1). Engines report their stages in
    # meta_info (SGLang's *_ts stamps, cluster.engines.shell.stamps), on their own clocks:
    # exact on one host, off by the hosts' clock offset across hosts. With `requests`
    # (t_arrival, t_first_token, t_done) they give the serving overheads the passes do not
    # account for (models.overheads, `overhead_fits`).
    "request_stages": (
        RUN_ID,
        _c("request_id", "VARCHAR", "the request (`requests.request_id`)"),
        _stage("t_dispatched", "the proxy sent it to the prefill and decode engines (routed)"),
        _stage("t_prefill_received", "the prefill engine's HTTP server took it"),
        _stage("t_prefill_queued", "the prefill engine's scheduler queued it"),
        _stage("t_prefill_forward", "the first prefill pass computing its prompt started"),
        _stage("t_prefill_done", "the prefill pass that sampled its first token ended"),
        _stage("t_kv_ready", "its KV (and first token) was in the decode engine"),
        _stage("t_decode_join", "it joined the decode engine's batch (first token emitted)"),
        _stage("t_first_emit", "the decode engine emitted the answer event of its first token"),
        _stage("t_last_emit", "the decode engine emitted the answer event of its last token"),
        _stage(
            "t_prefill_answer",
            "the proxy had the prefill engine's whole answer (it finishes a request once both "
            "engines answered)",
        ),
    ),
    # The serving overheads of a PD cluster run fitted per stage (models.overheads): each
    # stage's sample of durations from `request_stages` and `requests` (or the passes'
    # overhead_s), as empirical quantiles and a lognormal, with how many samples.
    "overhead_fits": (
        RUN_ID,
        _c(
            "stage",
            "VARCHAR",
            "the stage: ingress (proxy arrival -> prefill queue), prefill_wait (queue -> "
            "pass), handoff (pass end -> KV on the decode node), join (KV -> decode batch), "
            "first_out / last_out (engine emits a token -> the proxy forwards it), "
            "prefill_pass / decode_pass (per-pass CPU overhead outside the forward)",
        ),
        _c("fitted_at", "TIMESTAMP", "when it was fitted (UTC)"),
        _c("samples", "BIGINT", "durations the fit saw", nonnegative=True),
        _c("mean_s", "DOUBLE", "their mean", _S),
        _c(
            "quantiles_s",
            "DOUBLE[]",
            "empirical quantiles at probabilities 0, 0.05, ..., 1 (models.overheads.PROBS)",
            _S,
        ),
        _c(
            "bin_means_s",
            "DOUBLE[]",
            "means of equal-probability bins of the sorted durations (models.overheads.BINS): "
            "draws pick one bin uniformly, keeping the sample's mean and shape",
            _S,
        ),
        _c(
            "log_mu",
            "DOUBLE",
            "lognormal fit: mean of ln(duration) over positive ones",
            nullable=True,
        ),
        _c(
            "log_sigma",
            "DOUBLE",
            "lognormal fit: standard deviation of ln(duration)",
            nullable=True,
            nonnegative=True,
        ),
        _c(
            "per_seq_s",
            "DOUBLE",
            "pass stages: seconds per sequence in the pass beyond the first (the quantiles "
            "are at one sequence); 0 for request stages",
            _S,
            nullable=True,
            nonnegative=True,
        ),
    ),
}
