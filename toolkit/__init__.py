"""What a notebook user touches: plots, widgets, sessions and the `pdlab` CLI (SPEC §7)."""
