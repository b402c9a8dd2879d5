"""Experiments in one place: paper 000's qualitative results (`evolving_infra`), paper 003's
policy sweeps and search cells (`policy_sweeps`, `openevolve_evaluator`) and the SWE-agent
replay validation (`sweagent_replay`)."""
