"""A real torch serving engine that speaks the SGLang subset pdlab drives (SPEC §6, §9).

Paper 000 §4.1–4.2's symmetric engine on any machine: one scheduling loop serves prefill,
decode or both, a role switch keeps the prefix cache in place, and the KV pool writes
through to a host tier. The model is a small decoder-only transformer with random weights
(`model`, presets in `config`); KV lives in a paged pool (`kv_pool`) indexed by chained
block hashes (`prefix_cache`); `scheduler` runs chunked prefill and continuous batching,
timing every forward pass and publishing it as a ForwardPassMetrics message with exact
t_uc, attention pairs, t_rst and activated experts (`pass_metrics`); `transfer` moves a
prefilled request's KV bytes to a decode engine; `engine` and `http_api` serve SGLang's
HTTP API. Start one with `pdlab engine --model tiny-moe --port P`.
"""
