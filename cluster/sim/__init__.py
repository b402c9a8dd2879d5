"""The embedded default: a discrete-event simulator of a PD-disaggregated agent cluster (SPEC §5)."""
