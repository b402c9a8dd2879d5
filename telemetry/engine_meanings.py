"""What the telemetry columns mean when vLLM produced them (docs/telemetry.md, SPEC §3).

vLLM's iteration rows come from pdlab's stat-logger plugin (`toolkit/vllm_plugin.py`,
mapping in `cluster/wire/vllm_step_rows.py`): vLLM reports per-step counts, not
per-request batch contents, so some columns are exact, some estimated and some absent.
`telemetry.schema_doc` prints these beside each table's reference. Keys are table -> column.
"""

from __future__ import annotations

VLLM_SOURCE = (
    "pdlab's vLLM stat-logger plugin (`vllm.stat_logger_plugins: pdlab`, or "
    "`AsyncLLM(stat_loggers=[toolkit.vllm_plugin.pdlab_stat_logger(...)])`), written directly "
    "(`PDLAB_VLLM_DB`) or collected over ZMQ (`PDLAB_VLLM_STEPS` + `pdlab collect vllm-steps`); "
    "KV events from `vllm serve --kv-events-config` via `pdlab collect kv-events`"
)

VLLM_COLUMNS: dict[str, dict[str, str]] = {
    "prefill_iterations": {
        "iter_id": "the collector's own step counter per node (vLLM's step_counter is DP-internal)",
        "t_start": "the step's end (IterationStats.iteration_timestamp, front-end wall time) "
        "less its duration",
        "duration_s": "the whole engine step (schedule + forward + output): the smallest "
        "inter-token latency of the step's decoding requests (engine-core clock); for a step "
        "without decodes, the front-end interval since the previous step when the engine was "
        "busy, else the smallest TTFT of the step (an upper bound)",
        "num_reqs": "prefilling requests admitted and not yet at their first token (the "
        "plugin's ledger), plus the step's decoding requests",
        "t_uc": "exact with `--cudagraph-metrics` (scheduled tokens less one per decode); "
        "otherwise the ledger: uncached prompt tokens (prefix_cache_stats queries - hits) "
        "consumed in chunks of the token budget less the decodes; + 1 per decoding request",
        "attn_pairs": "estimated: equal shares of t_uc and t_c among the prefilling requests "
        "(per-request lengths are not reported), + each decode's context",
        "t_rst": "0: vLLM reports no tokens loaded from host memory per step",
        "t_c": "prefix hits of the step's new requests + earlier chunks of running prefills "
        "+ the decodes' context (from KV usage)",
        "experts_active": "NULL: not reported",
    },
    "decode_iterations": {
        "duration_s": "the smallest inter-token latency of the step (engine-core time between "
        "consecutive outputs of a request decoding in both): the whole step",
        "batch_size": "decoding requests of the step (entries of inter_token_latencies_iter)",
        "t_fwd": "their new tokens per request (num_generation_tokens / batch; > 1 with "
        "speculative decoding)",
        "ctx_tokens": "estimated: KV blocks in use (kv_cache_usage x num_gpu_blocks x "
        "block_size) less the prefilling context; prefix-shared blocks count once; 0 when "
        "the KV capacity is unknown",
        "experts_active": "NULL: not reported",
    },
    "requests": {
        "request_id": "generated (`vllm-e<engine>-<n>`): stat loggers do not see request ids",
        "t_arrival": "t_done - FinishedRequestStats.e2e_latency (front-end arrival)",
        "t_c": "FinishedRequestStats.num_cached_tokens",
        "t_prefill_start": "first token time - prefill_time (engine-core SCHEDULED event)",
        "t_first_token": "t_done - decode_time",
        "t_fetch": "0: KV transfers between instances are not reported",
    },
    "kv_events": {
        "tier": "medium 'GPU' -> gpu, 'CPU' / 'CPU_PINNED' (offloading connector) -> host; "
        "other media are skipped",
        "block_hash": "vLLM's sha256 block hash, low 64 bits read big-endian (= its int form "
        "under VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES)",
    },
}

VLLM_NOT_REPORTED: dict[str, str] = {
    "prefill_iterations": "per-request context lengths and chunk sizes, tokens restored from "
    "host memory, expert activations, GPU time alone (vLLM's native forward-pass metrics, "
    "`--forward-pass-metrics-port`, carry per-pass sums and CUDA time: collect those with "
    "`pdlab collect forward-metrics`)",
    "prefill_iteration_requests": "not written for vLLM: no per-request chunk sizes",
    "decode_iterations": "per-request context lengths, expert activations",
    "requests": "request ids, branch and program ids, the KV transfer of PD deployments",
}
