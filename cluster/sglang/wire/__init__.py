"""SGLang's and vLLM's wire formats and the collectors of their ZMQ streams (SPEC §3, §6)."""

from cluster.sglang.wire.fpm import (
    ForwardPassMetrics,
    decode_fpm,
    encode_fpm,
    estimate_attn_pairs,
)
from cluster.sglang.wire.fpm_collector import ForwardMetricsCollector
from cluster.sglang.wire.kv_collector import KVEventCollector
from cluster.sglang.wire.kv_events import (
    BatchDecoder,
    WireError,
    encode_batch,
    kv_event_rows,
    to_int64,
)
from cluster.sglang.wire.publisher import ZmqBatchPublisher
from cluster.sglang.wire.subscriber import SequencedSubscriber, StreamStats

__all__ = [
    "BatchDecoder",
    "ForwardMetricsCollector",
    "ForwardPassMetrics",
    "KVEventCollector",
    "SequencedSubscriber",
    "StreamStats",
    "WireError",
    "ZmqBatchPublisher",
    "decode_fpm",
    "encode_batch",
    "encode_fpm",
    "estimate_attn_pairs",
    "kv_event_rows",
    "to_int64",
]
