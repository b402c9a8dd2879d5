"""One request inside an engine: tokens computed, tokens generated, KV blocks held.

As vLLM V1 counts them: a request's tokens are its prompt plus what it generated so far;
`computed_tokens` of them have KV in the cache. An iteration computes `new_tokens` more
(a prefill chunk, or 1 for a decode); when every token is computed the iteration samples
one output token. Recompute preemption sets `computed_tokens` back to 0, so the request
prefills its prompt and its generated tokens again (as one longer prompt), less what
prefix caching kept (`block_pool.BlockPool.take_cached`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, eq=False)
class EngineRequest:
    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    computed_tokens: int = 0
    generated_tokens: int = 0
    blocks: int = 0
    cached_blocks: int = 0  # blocks of KV left in the free queue after a preemption
    first_token_s: float | None = None
    done_s: float | None = None
    num_preemptions: int = 0
    # Chained hashes of the full blocks of prompt + output token ids (prefix caching by
    # content, prefix_pool); empty when the token ids are unknown.
    block_hashes: tuple[int, ...] = ()
    hashed_blocks: int = 0  # leading blocks of it whose hash the pool has registered
    # Prompt tokens whose KV arrives from another engine before the first iteration (a PD
    # split's prefill instance): they count as computed on admission, like vLLM's KV
    # connector's external tokens.
    remote_kv_tokens: int = 0
    local_hit_tokens: int = 0  # prompt tokens found in this engine's prefix cache
    external_hit_tokens: int = 0  # prompt tokens loaded from a shared pool or a PD peer

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise ValueError(
                f"request {self.request_id!r}: prompt and output need >= 1 token, got "
                f"{self.prompt_tokens} and {self.output_tokens}"
            )

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens: what the KV cache must hold once all are computed."""
        return self.prompt_tokens + self.generated_tokens

    @property
    def new_tokens(self) -> int:
        """Tokens the next iteration would compute: a prefill's remainder, or 1 to decode."""
        return self.num_tokens - self.computed_tokens

    @property
    def is_decode(self) -> bool:
        return self.generated_tokens > 0 and self.new_tokens == 1

    @property
    def finished(self) -> bool:
        return self.done_s is not None

    def advance(self, computed: int, t_end_s: float) -> bool:
        """Record an iteration that computed `computed` tokens; True if it finished."""
        self.computed_tokens += computed
        if self.computed_tokens < self.num_tokens:
            return False
        self.generated_tokens += 1
        if self.first_token_s is None:
            self.first_token_s = t_end_s
        if self.generated_tokens >= self.output_tokens:
            self.done_s = t_end_s
            return True
        return False

    def reset_for_recompute(self) -> None:
        self.computed_tokens = 0
        self.num_preemptions += 1
