"""`pdlab validate`: real runs through the twin, and the twin beside AIConfigurator on silicon
rows (issue 22, SPEC §10)."""
