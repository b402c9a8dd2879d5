"""Live PD clusters of real engines that speak SGLang's HTTP subset (SPEC §6): SGLang itself,
pdlab's torch engine and the stand-in (`cluster.engines`). `cluster.SGLangCluster` is a
`ClusterEngines` (cluster.control.engines) over a cluster file's engines, built from
`cluster_file` (discovery), `fleet` (per-engine state, collectors, health), `kv_sync` (the
engines' KV usage, branch counts pushed to their eviction), `telemetry_run`, the PD
data-plane proxy (`proxy`, with `live_request`, `inflight`, `engine_calls`), role switches
(`role_switch`, which reaches the cluster only through the `SwitchHost` port), online refits (`online_fit`) and `serving` (its routes, a loopback server);
`launched.LaunchedCluster` also starts and stops the engine processes from a command
template (`pdlab serve --engines torch`); `agent_client` plays agent programs through the
proxy and `agent_loop` keeps a workload's agents playing from a background thread. It
imports no server and no engine; the streams it reads are `cluster.wire`'s and
`cluster.sglang`'s. `attached.AttachedFleet` watches a fleet pdlab did not start (`pdlab attach`)."""
