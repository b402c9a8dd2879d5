"""Engine streams over ZMQ that are not SGLang's alone (SPEC §3, §6): the KV event formats
of SGLang and vLLM (`kv_events`), the sequenced publisher and subscriber they share, the KV
event collector, pdlab's vLLM step stream (`vllm_steps`, `vllm_step_rows`,
`vllm_step_collector`), the iteration rows every stream maps to (`iteration_rows`) and the
stand-in's toy tokenizer. SGLang's own formats (forward-pass metrics, HTTP payloads, stage
stamps) are in `cluster.sglang`."""

from cluster.wire.iteration_rows import DecodeRow, PrefillRow, estimate_attn_pairs
from cluster.wire.kv_collector import KVEventCollector
from cluster.wire.kv_events import (
    BatchDecoder,
    WireError,
    encode_batch,
    kv_event_rows,
    to_int64,
)
from cluster.wire.publisher import ZmqBatchPublisher
from cluster.wire.subscriber import SequencedSubscriber, StreamStats

__all__ = [
    "BatchDecoder",
    "DecodeRow",
    "KVEventCollector",
    "PrefillRow",
    "SequencedSubscriber",
    "StreamStats",
    "WireError",
    "ZmqBatchPublisher",
    "encode_batch",
    "estimate_attn_pairs",
    "kv_event_rows",
    "to_int64",
]
