"""Every metric `GET /metrics` serves, once: name, type, labels, unit, meaning (SPEC §6).

The exporters (`row_metrics.py` for what the telemetry rows count, `metrics.py` for what a
scrape reads off the cluster) build their families from these specs, `metrics_doc.py`
writes docs/metrics.md from them, and a test holds a live scrape to exactly this list.
To add a metric: one `MetricSpec` here, its value where its source lives, then regenerate
the reference (`python -m cluster.server.metrics_doc > docs/metrics.md`).

Names follow Prometheus conventions (base units: seconds, tokens, blocks; `_total` on
counters) under the `pdlab_` prefix, and take vLLM's name where the meaning is the same
(`vllm:time_to_first_token_seconds` -> `pdlab_time_to_first_token_seconds`,
`vllm:num_requests_running`, `vllm:kv_cache_usage_perc` — a fraction, as in vLLM, ...).
Latency buckets are vLLM V1's (`vllm/v1/metrics/loggers.py`), with finer low ends where a
PD cluster's values sit (decode steps of a few milliseconds). Names served before these
histograms existed stay (`legacy`), each pointing at its successor.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

Kind = Literal["counter", "gauge", "histogram"]

# vLLM V1's TTFT buckets, with 2.5 ms and 25 ms added; also the queue-time buckets.
TTFT_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.025, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
# vLLM V1's time-per-output-token buckets, below 10 ms refined (fast decode steps).
TPOT_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
    0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
# vLLM V1's request-latency buckets (E2E, queue, prefill, decode time).
E2E_BUCKETS_S = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
# One forward pass: a decode step of a few ms to a long prefill chunk of seconds.
ITERATION_BUCKETS_S = (
    0.0005, 0.001, 0.002, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1,
    0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0,
)  # fmt: skip


class MetricSpec(NamedTuple):
    """One metric family. `name` is what a query names (counters with `_total`; a
    histogram's series add `_bucket`, `_sum`, `_count`). `source` says where its value comes
    from (a telemetry table of SPEC §3, or the cluster's state at scrape time)."""

    name: str
    kind: Kind
    labels: tuple[str, ...]
    unit: str
    help: str
    source: str
    buckets: tuple[float, ...] = ()
    legacy: str | None = None  # the metric to use instead (kept for existing queries)

    @property
    def base_name(self) -> str:
        """The family's name as prometheus_client takes it (a counter without `_total`)."""
        return self.name.removesuffix("_total") if self.kind == "counter" else self.name


def _h(
    name: str, labels: tuple[str, ...], buckets: tuple[float, ...], help: str, source: str
) -> MetricSpec:
    return MetricSpec(name, "histogram", labels, "seconds", help, source, buckets)


NODE = ("node",)
REQ = "telemetry: requests"
ITER = "telemetry: prefill_iterations, decode_iterations"
PREFILL = "telemetry: prefill_iterations"
STATE = "cluster state at scrape time"

# Counted from the telemetry rows the engines write (row_metrics.py).
ROW_METRICS: tuple[MetricSpec, ...] = (
    _h("pdlab_time_to_first_token_seconds", NODE, TTFT_BUCKETS_S,
       "Time to first token of finished requests (t_first_token - t_arrival; a request that "
       "streamed no token counts its E2E); node: the prefill node", REQ),
    _h("pdlab_request_time_per_output_token_seconds", NODE, TPOT_BUCKETS_S,
       "Mean time per output token after the first, per finished request with >= 2 output "
       "tokens ((t_done - t_first_token) / (t_out - 1)); node: the decode node", REQ),
    _h("pdlab_e2e_request_latency_seconds", (), E2E_BUCKETS_S,
       "End-to-end latency of finished requests (t_done - t_arrival), cluster-wide", REQ),
    _h("pdlab_request_queue_time_seconds", NODE, TTFT_BUCKETS_S,
       "Time from arrival to the start of prefill (t_prefill_start - t_arrival), where "
       "recorded; node: the prefill node", REQ),
    _h("pdlab_iteration_duration_seconds", ("node", "phase"), ITERATION_BUCKETS_S,
       "Duration of one forward pass of a node (T_P of Eq. 1, T_D(B) of Eq. 2); phase: "
       "prefill (prefill or mixed passes) or decode", ITER),
    MetricSpec("pdlab_request_success_total", "counter", (), "requests",
               "Requests finished (requests rows with t_done)", REQ),
    MetricSpec("pdlab_request_failure_total", "counter", (), "requests",
               "Requests that ended unfinished (a live engine failed them; requests rows "
               "without t_done)", REQ),
    MetricSpec("pdlab_prompt_tokens_total", "counter", NODE, "tokens",
               "Prompt tokens of finished requests (t_in, cached ones included); node: the "
               "prefill node", REQ),
    MetricSpec("pdlab_generation_tokens_total", "counter", NODE, "tokens",
               "Output tokens of finished requests (t_out); node: the decode node", REQ),
    MetricSpec("pdlab_prefix_cache_hits_total", "counter", NODE, "tokens",
               "Prompt tokens found cached (t_c; hit rate h = hits / prompt tokens); node: "
               "the prefill node", REQ),
    MetricSpec("pdlab_kv_fetched_tokens_total", "counter", NODE, "tokens",
               "Prompt tokens fetched from another node's host memory (t_fetch); node: the "
               "prefill node", REQ),
    MetricSpec("pdlab_kv_lost_reuse_tokens_total", "counter", NODE, "tokens",
               "Lost KV reuse: prompt tokens an unlimited cache shared by all nodes would "
               "have held but the node did not (t_ideal_c - t_c, at least 0; 1 - h/h* of "
               "SPEC §5), for requests whose ideal is known (simulated clusters); node: the "
               "prefill node", REQ),
    MetricSpec("pdlab_prefill_computed_tokens_total", "counter", NODE, "tokens",
               "Tokens computed by prefill passes (sum of t_uc, Eq. 1)", PREFILL),
    MetricSpec("pdlab_prefill_restored_tokens_total", "counter", NODE, "tokens",
               "Tokens restored from host memory by prefill passes (sum of t_rst, Eq. 1)",
               PREFILL),
    MetricSpec("pdlab_node_phase_switches_total", "counter",
               ("node", "from_phase", "to_phase", "trigger"), "switches",
               "Completed phase switches (trigger: planner or manual)",
               "telemetry: phase_switches"),
    MetricSpec("pdlab_kv_lost_blocks_total", "counter", NODE, "blocks",
               "KV blocks a node could no longer serve after its phase switches (relaunch, "
               "a role switch that releases the prefix cache); 0 when kept",
               "telemetry: phase_switches"),
    MetricSpec("pdlab_kv_evicted_blocks_total", "counter", ("node", "tier"), "blocks",
               "KV blocks evicted from a node's tier (gpu, host) by its eviction or retention "
               "policy (simulated clusters: live engines report no evictions as such, their "
               "removals reach the directory as KV events)",
               "telemetry: evictions"),
)  # fmt: skip

# Read off the cluster at scrape time (metrics.py).
STATE_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("pdlab_sim_time_seconds", "gauge", (), "seconds",
               "The cluster's clock: simulated seconds of a simulated run, seconds since the "
               "start of a live one", STATE),
    MetricSpec("pdlab_split_nodes", "gauge", ("phase",), "nodes",
               "Nodes serving each phase (the PD split)", STATE),
    MetricSpec("pdlab_node_phase", "gauge", ("node", "phase"), "",
               "1 for the phase a node serves, 0 for the other", STATE),
    MetricSpec("pdlab_node_healthy", "gauge", NODE, "",
               "1 while the node's engine is up, 0 when it is down (a down node has no "
               "running, waiting or KV samples: its last values would be stale)", STATE),
    MetricSpec("pdlab_node_switching", "gauge", NODE, "",
               "1 while the node drains for a phase switch", STATE),
    MetricSpec("pdlab_num_requests_running", "gauge", NODE, "requests",
               "Requests in the node's running batch (prefill or decode)", STATE),
    MetricSpec("pdlab_num_requests_waiting", "gauge", NODE, "requests",
               "Requests queued for prefill on the node", STATE),
    MetricSpec("pdlab_num_requests_waiting_kv", "gauge", NODE, "requests",
               "Requests waiting for their KV to arrive before decoding on the node", STATE),
    MetricSpec("pdlab_requests_in_flight", "gauge", (), "requests",
               "Requests admitted and not finished, cluster-wide", STATE),
    MetricSpec("pdlab_kv_cache_used_tokens", "gauge", ("node", "tier"), "tokens",
               "KV held in a node's tier (gpu, host)", STATE),
    MetricSpec("pdlab_kv_cache_capacity_tokens", "gauge", ("node", "tier"), "tokens",
               "KV capacity of a node's tier (0: the tier is absent or not reported)", STATE),
    MetricSpec("pdlab_kv_cache_usage_perc", "gauge", ("node", "tier"), "ratio",
               "KV use of a node's tier as a fraction of its capacity, 1 = full (as vLLM's "
               "gauge of that name); absent where the capacity is 0", STATE),
    MetricSpec("pdlab_branches_active", "gauge", (), "branches",
               "Active agent branches in the branch table (Alg. E.1)", STATE),
    MetricSpec("pdlab_directory_blocks", "gauge", (), "blocks",
               "Blocks in the cluster-wide KV directory", STATE),
    MetricSpec("pdlab_directory_holdings", "gauge", (), "blocks",
               "Block-node pairs in the KV directory (a block on two nodes counts twice)",
               STATE),
    MetricSpec("pdlab_directory_counted_holdings", "gauge", (), "blocks",
               "Block-node pairs with a branch count R_{b,n} > 0 (Alg. E.2)", STATE),
    MetricSpec("pdlab_node_directory_blocks", "gauge", NODE, "blocks",
               "Blocks the KV directory records on the node", STATE),
    MetricSpec("pdlab_directory_events_total", "counter", (), "events",
               "KV events the directory applied", STATE),
    MetricSpec("pdlab_planner_gain_requests_per_second", "gauge", ("prefill_nodes",),
               "requests/s",
               "Mean over slices of the throughput gain g_i of each candidate split at the "
               "planner's last evaluation (Eq. 6); prefill_nodes: the candidate's", STATE),
    MetricSpec("pdlab_planner_gain_std_requests_per_second", "gauge", ("prefill_nodes",),
               "requests/s", "Standard deviation of g_i at the last evaluation (Eq. 6)",
               STATE),
    MetricSpec("pdlab_planner_candidate_qualified", "gauge", ("prefill_nodes",), "",
               "1 when the candidate passed the gain test mean(g) > 2 std(g) / sqrt(m)",
               STATE),
    MetricSpec("pdlab_planner_last_evaluation_time_seconds", "gauge", (), "seconds",
               "When the planner last evaluated (the cluster's clock); absent before",
               STATE),
    MetricSpec("pdlab_planner_recommended_prefill_nodes", "gauge", (), "nodes",
               "Prefill nodes of the split the last evaluation chose; absent when none "
               "qualified", STATE),
    # Kept for existing queries and dashboards; each names its successor.
    MetricSpec("pdlab_node_queue_requests", "gauge", NODE, "requests",
               "Requests queued for prefill on the node", STATE,
               legacy="pdlab_num_requests_waiting"),
    MetricSpec("pdlab_node_running_requests", "gauge", NODE, "requests",
               "Requests in the node's running batch", STATE,
               legacy="pdlab_num_requests_running"),
    MetricSpec("pdlab_node_kv_gpu_used_tokens", "gauge", NODE, "tokens",
               "KV tokens held in GPU memory", STATE,
               legacy='pdlab_kv_cache_used_tokens{tier="gpu"}'),
    MetricSpec("pdlab_node_kv_host_used_tokens", "gauge", NODE, "tokens",
               "KV tokens held in host memory", STATE,
               legacy='pdlab_kv_cache_used_tokens{tier="host"}'),
    MetricSpec("pdlab_latency_seconds", "gauge", ("metric", "quantile"), "seconds",
               "Rolling TTFT / E2E quantiles (0.5, 0.95) over the server's latency window "
               "(cluster clock); cannot be aggregated", STATE,
               legacy="histogram_quantile over pdlab_time_to_first_token_seconds_bucket, "
               "pdlab_e2e_request_latency_seconds_bucket"),
    MetricSpec("pdlab_requests_completed_total", "counter", (), "requests",
               "Requests completed (counted as the engines report them)", STATE,
               legacy="pdlab_request_success_total"),
    MetricSpec("pdlab_phase_switches_total", "counter", (), "switches",
               "Completed phase switches", STATE, legacy="pdlab_node_phase_switches_total"),
)  # fmt: skip

CATALOG: tuple[MetricSpec, ...] = ROW_METRICS + STATE_METRICS
BY_NAME: dict[str, MetricSpec] = {m.name: m for m in CATALOG}
