"""Node hardware: profiles of iteration-time ground truth (Eq. 1–2 coefficients plus the
effects fitted models omit), MoE shape and KV capacities, presets and fitted files."""
