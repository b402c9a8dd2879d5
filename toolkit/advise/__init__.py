"""`pdlab advise`: the PD splits of N nodes ranked for a recorded run's workload (SPEC §9)."""
