"""What every pdlab engine process shares, whatever runs its forward passes (SPEC §6).

`lifecycle.EngineShell` is the engine process without its scheduler: ZMQ publishers of KV
events and forward-pass metrics, the HTTP server and, in a PD role, the bootstrap server
(`loopback`), the `/server_info` wire fields, in-flight tracking and the generation
plumbing (bootstrap-room checks, the decode side's transfer, updates from the scheduler
thread). `sglang_http` serves SGLang 0.5.23's HTTP subset over any engine that meets its
`SGLangEngine` protocol, checking bodies at the door (`http_input`) behind `guard` (body
size, and the token and JSON a mutation needs); `bootstrap` is SGLang's PD bootstrap server
and the room registry; `scheduling` the roles, finish reasons and the scheduler thread both
engines run, which aborts the request of a client that went away. The
engines (`cluster.engines.standin`, `cluster.engines.torch`) keep what differs: how a pass
is timed and what a prefill hands to decode.
"""
