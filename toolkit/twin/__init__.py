"""`pdlab twin`: a recorded run replayed on models of its serving (SPEC §9)."""
