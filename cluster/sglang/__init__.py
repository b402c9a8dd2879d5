"""Live SGLang (and vLLM) engines (SPEC §6): wire formats, ZMQ collectors, the SGLang stand-in.

Nothing here imports sglang: the wire formats are re-declared from SGLang 0.5.23's and vLLM's
sources (`wire`, `fpm`), and `standin` is a protocol-faithful fake SGLang server that runs on
CPU so the live-cluster code can be tested without GPUs. The live cluster itself
(`backend.SGLangCluster`, the PD proxy, phase switches, `serving.create_sglang_app`) is
imported from its modules: it pulls in the control server.
"""

from cluster.sglang.cluster_file import (
    ClusterConfig,
    ClusterSettings,
    EngineSpec,
    discover_engine,
    load_cluster_config,
    load_cluster_file,
)
from cluster.sglang.forward_metrics import ForwardMetricsCollector
from cluster.sglang.fpm import ForwardPassMetrics, decode_fpm, encode_fpm, estimate_attn_pairs
from cluster.sglang.kv_collector import KVEventCollector
from cluster.sglang.publisher import ZmqBatchPublisher
from cluster.sglang.subscriber import SequencedSubscriber, StreamStats
from cluster.sglang.wire import BatchDecoder, WireError, encode_batch, kv_event_rows, to_int64

__all__ = [
    "BatchDecoder",
    "ClusterConfig",
    "ClusterSettings",
    "EngineSpec",
    "ForwardMetricsCollector",
    "ForwardPassMetrics",
    "KVEventCollector",
    "SequencedSubscriber",
    "StreamStats",
    "WireError",
    "ZmqBatchPublisher",
    "decode_fpm",
    "discover_engine",
    "encode_batch",
    "encode_fpm",
    "estimate_attn_pairs",
    "kv_event_rows",
    "load_cluster_config",
    "load_cluster_file",
    "to_int64",
]
