"""Predicted TTFT with exposed fetch and copy price (paper 000 §5.3, Eq. 7, Alg. E.3).

T_hat_n = W_n + T_P^req(w_n) + max(0, tau(x_n) - W_n) + kappa * x_n
W_n = T_rem,n + sum_{j in Q_n} T_P^req(w_j); x_n tokens fetched from another node.
tau(x) = 0.45 s + 1 us * x for x >= 512, no fetch below 512 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FetchModel:
    """tau(x): time to fetch x tokens of KV from a peer's host memory."""

    base_s: float = 0.45
    per_token_s: float = 1e-6
    min_tokens: int = 512

    def fetches(self, tokens: float) -> bool:
        return tokens >= self.min_tokens

    def time(self, tokens: float) -> float:
        return self.base_s + self.per_token_s * tokens if tokens >= self.min_tokens else 0.0


def predicted_ttft(
    wait_s: float,
    service_s: float,
    fetch_tokens: float = 0.0,
    copy_price_s_per_token: float = 0.0,
    fetch: FetchModel | None = None,
) -> float:
    """Eq. 7 plus the part of the fetch that outlasts the wait and the copy price."""
    fm = fetch or FetchModel()
    tau = fm.time(fetch_tokens)
    return wait_s + service_s + max(0.0, tau - wait_s) + copy_price_s_per_token * fetch_tokens
