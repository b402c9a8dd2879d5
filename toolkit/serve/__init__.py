"""The composition roots of `pdlab serve`: a live cluster (simulated, SGLang, torch) behind the
control server (SPEC §6), and the processes they start."""
