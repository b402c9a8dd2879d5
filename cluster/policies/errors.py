"""Errors of the policy planes (paper 003 §3.1: policies see only non-anticipatory state)."""

from __future__ import annotations

from cluster.core import ConfigError


class PolicyError(ConfigError):
    """A policy broke the planes' contract: it read state it may not see (future output
    lengths, tool durations, the program's turns), mutated a read-only view, returned an
    unknown decision, or a policy class lacks a required hook. The message names what was
    wrong and what is allowed. Deliberately not an AttributeError, so `getattr(pcb, name,
    default)` and `hasattr` cannot silently swallow a peek at future state."""
