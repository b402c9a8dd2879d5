"""A protocol-faithful SGLang stand-in (SPEC §6): the same HTTP endpoints, KV-event and
forward-pass-metrics wire formats, PD bootstrap and role-switch semantics as SGLang 0.5.23,
with forward passes that sleep for the time the iteration-time models give.

`server.StandinEngine` is one engine (role, `/server_info`, generation) on the shared
`cluster.engines.shell.EngineShell` (lifecycle, publishers, servers); `http_api` its
routes beyond the shared ones, `role_switch` its /pd_role_switch, `scheduler` its batches
and timings, `prefix_cache` its radix cache, `bootstrap` its PD transfer route."""
