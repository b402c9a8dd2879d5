"""Tables of imported real runs of serving clusters and what they are validated against.

`pdlab import lss-run` fills them (toolkit.importers.lss_run), `pdlab validate` reads them
(toolkit.validate.run). Defined here to keep telemetry/schema.py short; schema.py merges them
into `TABLES` with its own column builder, so they are checked and documented like the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def imported_tables(c: Callable[..., Any], run_id: Any) -> dict[str, tuple[Any, ...]]:
    """The tables, built with schema.py's column builder `c` and its `run_id` column."""
    return {
        # Imported real runs of a cluster of engines (`pdlab import lss-run`): the cluster
        # description, the requests' token ids, the operator profiles, and the measured and
        # simulated series and means they are validated against (`pdlab validate`).
        "cluster_instances": (
            run_id,
            c(
                "node_id",
                "INTEGER",
                "the instance (`nodes.node_id`), in the cluster config's order",
                nonnegative=True,
                node_ref=True,
            ),
            c("model", "VARCHAR", "the model it serves (Hugging Face name)"),
            c("hardware", "VARCHAR", "its GPU"),
            c("tp", "INTEGER", "tensor-parallel degree: GPUs of the instance", positive=True),
            c(
                "role",
                "VARCHAR",
                "what it serves: every phase, or one side of a PD split",
                allowed=("collocated", "prefill", "decode"),
            ),
            c(
                "gpu_memory_gib",
                "DOUBLE",
                "GPU memory per GPU for weights and KV (the config's npu_mem.mem_size)",
                "GiB",
                positive=True,
            ),
            c(
                "memory_gbps",
                "DOUBLE",
                "GPU memory bandwidth (npu_mem.mem_bw)",
                "GB/s",
                nullable=True,
                positive=True,
            ),
            c(
                "link_gbps",
                "DOUBLE",
                "link between instances (PD KV transfer) and between the instance's GPUs",
                "GB/s",
                nullable=True,
                positive=True,
            ),
            c(
                "link_latency_s",
                "DOUBLE",
                "latency of that link",
                "s",
                nullable=True,
                nonnegative=True,
            ),
            c(
                "host_memory_gib",
                "DOUBLE",
                "CPU memory of its node (the prefix pool's capacity)",
                "GiB",
                nullable=True,
                positive=True,
            ),
            c(
                "host_memory_gbps",
                "DOUBLE",
                "CPU memory bandwidth (loads from the prefix pool)",
                "GB/s",
                nullable=True,
                positive=True,
            ),
            c("prefix_caching", "BOOLEAN", "GPU prefix caching (vLLM's block-hash cache) on"),
            c(
                "prefix_pool",
                "VARCHAR",
                "second prefix-cache tier: none, the node's CPU memory, or a CPU pool shared by "
                "the instances",
                allowed=("none", "cpu", "cpu-shared"),
            ),
        ),
        "request_tokens": (
            run_id,
            c("request_id", "VARCHAR", "the request (`requests.request_id`)"),
            c("input_token_ids", "JSON", "its prompt's token ids (a JSON array)"),
            c("output_token_ids", "JSON", "the token ids it generated (a JSON array)"),
        ),
        "operator_profiles": (
            run_id,
            c("model", "VARCHAR", "the model profiled"),
            c("hardware", "VARCHAR", "the GPU profiled"),
            c("tp", "INTEGER", "the TP degree it prices", positive=True),
            c("source", "VARCHAR", "the profile folder it was imported from"),
            c(
                "profile",
                "JSON",
                "the pdlab-operator-profile document (cluster.hardware.operator_profile)",
            ),
        ),
        "reference_series": (
            run_id,
            c(
                "source",
                "VARCHAR",
                "who produced it: 'real' (the measured run) or a simulator's name (a peer)",
            ),
            c("scope", "VARCHAR", "what it describes", allowed=("cluster", "instance", "pool")),
            c(
                "node_id",
                "INTEGER",
                "the instance (scope 'instance'); NULL otherwise",
                nullable=True,
                nonnegative=True,
                node_ref=True,
            ),
            c(
                "metric",
                "VARCHAR",
                "throughput_tok_s: output tokens generated in the tick (tokens/s); gpu_mem_mb: GPU "
                "memory in use, weights and KV (MB); prefix_hit_pct: prompt tokens found in the "
                "GPU prefix cache since the start (%); cpu_mem_mb, cpu_prefix_hit_pct: the same "
                "of the CPU prefix pool; running_reqs, waiting_reqs: requests the engines ran "
                "and queued at their last step of the tick (requests); kv_cache_pct: GPU KV "
                "blocks in use (%); prompt_throughput_tok_s: prompt tokens of prefills finished "
                "in the tick (tokens/s); preempted_reqs: requests preempted in the tick",
                allowed=(
                    "throughput_tok_s",
                    "gpu_mem_mb",
                    "prefix_hit_pct",
                    "cpu_mem_mb",
                    "cpu_prefix_hit_pct",
                    "running_reqs",
                    "waiting_reqs",
                    "kv_cache_pct",
                    "prompt_throughput_tok_s",
                    "preempted_reqs",
                ),
            ),
            c(
                "t",
                "DOUBLE",
                "the tick's end, seconds since the first arrival",
                "s",
                nonnegative=True,
            ),
            c("value", "DOUBLE", "the metric at that tick (unit: see metric)", nonnegative=True),
        ),
        "reference_latency": (
            run_id,
            c("framework", "VARCHAR", "who measured or simulated it ('vLLM': the real run)"),
            c("is_real", "BOOLEAN", "the real run's row (the others are peers' figures)"),
            c(
                "throughput_tok_s",
                "DOUBLE",
                "output tokens per second",
                "tokens/s",
                nullable=True,
                nonnegative=True,
            ),
            c(
                "ttft_mean_s",
                "DOUBLE",
                "mean time to first token",
                "s",
                nullable=True,
                nonnegative=True,
            ),
            c(
                "tpot_mean_s",
                "DOUBLE",
                "mean time per output token",
                "s",
                nullable=True,
                nonnegative=True,
            ),
            c(
                "e2e_mean_s",
                "DOUBLE",
                "mean end-to-end latency",
                "s",
                nullable=True,
                nonnegative=True,
            ),
        ),
    }
