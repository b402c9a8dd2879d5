"""Iteration rows of a forward pass, as every engine stream maps them (paper 000 §5.1, Eq. 1–2).

`PrefillRow` and `DecodeRow` are what SGLang's forward-pass metrics
(`cluster.sglang.fpm`) and vLLM's step stream (`cluster.wire.vllm_step_rows`) become
before they reach `prefill_iterations` / `decode_iterations`; `estimate_attn_pairs`
recovers ΣA when a stream sends only sums and a variance.

ΣA (Eq. 1) is not sent, so it is estimated from n, U = Σu_i, C = Σc_i and σ_L²:
ΣA = Σu_i c_i + Σu_i²/2 + U/2 with Σu_i c_i ≈ ū·C (no covariance between new and cached
lengths within a pass) and Σu_i² = n(σ_u² + ū²), where σ_u² is recovered from the reported
variance of the full prompt lengths L = u + c by assuming zero covariance and equal
coefficients of variation of u and c: σ_u² = σ_L²·ū²/(ū² + c̄²). A pass that used its chunk
budget (U ≥ 0.9·chunk_tokens, when the budget is known) may hold a request mid-chunk whose
prompt length says nothing about its chunk, so there σ_u² = 0. The estimate is clamped
into the exact bounds [U²/(2n) + U/2, U·C + U²/2 + U/2]. It is exact for a single request,
for passes without cache hits (c̄ = 0) and when u and c are each equal across requests;
tests/cluster/sglang/test_sglang_wire.py measures the error on synthetic passes: mean
6-14% (p95 16-26%) when lengths vary independently, 0.3% on chunk-limited passes. The naive
use of σ_L² as the variance of t_uc overestimates by n·Var(c)/2 (mean 50-340% there).
"""

from __future__ import annotations

from typing import NamedTuple


def estimate_attn_pairs(
    num_reqs: int,
    sum_t_uc: float,
    sum_t_c: float,
    var_input_len: float,
    chunk_tokens: int | None = None,
) -> float:
    """ΣA of a prefill pass from FPM sums and the prompt-length variance (module docstring)."""
    if num_reqs <= 0 or sum_t_uc <= 0:
        return 0.0
    n, u, c = float(num_reqs), float(sum_t_uc), float(sum_t_c)
    u_mean, c_mean = u / n, c / n
    budget_full = chunk_tokens is not None and u >= 0.9 * chunk_tokens
    var_u = 0.0
    if not budget_full and var_input_len > 0:
        var_u = var_input_len * u_mean * u_mean / (u_mean * u_mean + c_mean * c_mean)
    est = u_mean * c + n * (var_u + u_mean * u_mean) / 2.0 + u / 2.0
    lower = u * u / (2.0 * n) + u / 2.0
    upper = u * c + u * u / 2.0 + u / 2.0
    return min(max(est, lower), upper)


class PrefillRow(NamedTuple):
    t_start: float
    duration_s: float
    num_reqs: int
    t_uc: int
    attn_pairs: float
    t_rst: int
    t_c: int
    experts_active: float | None = None
    overhead_s: float | None = None
    cpu_s: float | None = None


class DecodeRow(NamedTuple):
    t_start: float
    duration_s: float
    batch_size: int
    t_fwd: float
    ctx_tokens: int
    experts_active: float | None = None
    overhead_s: float | None = None
    cpu_s: float | None = None
