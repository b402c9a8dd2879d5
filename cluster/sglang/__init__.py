"""SGLang's own formats (SPEC §6), re-declared from its sources; nothing here imports sglang.

- `fpm`, `fpm_collector`: SGLang's forward-pass metrics and their collector into
  `prefill_iterations` / `decode_iterations`;
- `payloads`: SGLang's response payloads as the PD proxy reads them;
- `stamps`: the `*_ts` stage stamps of SGLang's answers.

What SGLang shares with vLLM and pdlab's engines lives below (`cluster.wire`: KV events,
the ZMQ publisher/subscriber, vLLM's step stream); the live clusters of engines that speak
SGLang's HTTP subset (SGLang, the torch engine, the stand-in) live in `cluster.live`, the
engines in `cluster.engines`.
"""

from cluster.sglang.fpm import ForwardPassMetrics, decode_fpm, encode_fpm
from cluster.sglang.fpm_collector import ForwardMetricsCollector

__all__ = ["ForwardMetricsCollector", "ForwardPassMetrics", "decode_fpm", "encode_fpm"]
