"""The real runs pdlab ships (toolkit/data/), each loaded in one call."""
