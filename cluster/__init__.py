"""Control plane, engine backends, workloads, simulator and control API (SPEC §4–6)."""
