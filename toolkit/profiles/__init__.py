"""Real GPU profiles: per-iteration times composed from them, their fit report, and the torch
engine's profile calibrated in situ (paper 000 §5.1 Eq. 1-2)."""
