"""SGLang (and vLLM) engines under pdlab (SPEC §6), in two parts.

- `cluster.sglang.wire`: SGLang's wire formats re-declared from its sources (KV events,
  forward-pass metrics, HTTP payloads), the ZMQ publisher/subscriber and the collectors that
  write those streams to DuckDB. Nothing there imports sglang, the control plane or a server.
- `cluster.sglang.live`: the live adapter: a PD cluster of SGLang-speaking engines under the
  control plane (engine discovery, the data-plane proxy, role switches, online refits).

The protocol-faithful stand-in engine used by tests and demos is `cluster.engines.standin`.
"""
