"""The torch engine's model pieces: presets, paged vs dense attention, MoE routing."""

from __future__ import annotations

import pytest
import torch

from cluster.core import ConfigError
from cluster.engines.torch.attention import PassLayout, SeqSlice, dense_attention
from cluster.engines.torch.config import PRESETS, EngineConfig, ModelConfig, preset
from cluster.engines.torch.kv_pool import KVPool
from cluster.engines.torch.model import MoEFFN, Transformer


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_parameter_counts_match_the_built_model(name: str) -> None:
    cfg = preset(name)
    model = Transformer(cfg, device="meta")
    assert sum(p.numel() for p in model.parameters()) == cfg.num_parameters()
    assert cfg.active_parameters() <= cfg.num_parameters()
    assert cfg.is_moe == (name != "small-dense")


def test_bad_shapes_and_settings_are_refused_with_the_allowed_values() -> None:
    with pytest.raises(ConfigError, match="choose one of: tiny-moe"):
        preset("huge")
    with pytest.raises(ConfigError, match="top_k"):
        ModelConfig("x", 512, 64, 1, 4, 2, 64, num_experts=4, top_k=5)
    with pytest.raises(ConfigError, match="eviction policy"):
        EngineConfig(eviction="fifo")
    with pytest.raises(ConfigError, match="device"):
        EngineConfig(device="tpu")


def test_paged_attention_equals_dense_attention() -> None:
    """Mixed pass: two decode requests and two prefill chunks (one with a cached prefix),
    their pages scattered over the pool; each output equals unpaged causal attention."""
    torch.manual_seed(0)
    cfg = preset("tiny-moe")
    ps, heads, kvh, hd = 4, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    pool = KVPool(cfg, ps, 64, 0, torch.device("cpu"), torch.float32)
    # (cached tokens, new tokens) per request; pages drawn without order from the pool.
    shape = [(9, 1), (0, 7), (13, 6), (2, 1)]
    perm = torch.randperm(64).tolist()
    seqs, full_k, full_v = [], [], []
    for cached, new in shape:
        n_pages = -(-(cached + new) // ps)
        pages = [perm.pop() for _ in range(n_pages)]
        seqs.append(SeqSlice(new, cached, pages))
        full_k.append(torch.randn(cached + new, kvh, hd))
        full_v.append(torch.randn(cached + new, kvh, hd))
    layout = PassLayout(seqs, ps, torch.device("cpu"))
    k_pool, v_pool = pool.layer(0)
    # The cached prefixes are already in their pages; the new tokens go through write().
    for s, k, v in zip(seqs, full_k, full_v, strict=True):
        for p in range(s.num_cached):
            slot = s.pages[p // ps] * ps + p % ps
            k_pool[slot], v_pool[slot] = k[p], v[p]
    new_k = torch.cat([k[s.num_cached :] for s, k in zip(seqs, full_k, strict=True)])
    new_v = torch.cat([v[s.num_cached :] for s, v in zip(seqs, full_v, strict=True)])
    k_pool, v_pool = pool.write(0, layout.write_slots, new_k, new_v)
    q = torch.randn(layout.num_tokens, heads, hd)
    got = layout.attend(q, k_pool, v_pool)
    start = 0
    for s, k, v in zip(seqs, full_k, full_v, strict=True):
        want = dense_attention(q[start : start + s.num_new], k, v, num_cached=s.num_cached)
        torch.testing.assert_close(got[start : start + s.num_new], want, rtol=1e-5, atol=1e-5)
        start += s.num_new
    assert layout.attn_pairs == sum(c * n + n * (n + 1) // 2 for c, n in shape)


def test_moe_renormalizes_top_k_and_counts_the_experts_it_runs() -> None:
    torch.manual_seed(1)
    moe = MoEFFN(d=16, ffn=8, num_experts=8, top_k=2)
    for p in moe.parameters():
        torch.nn.init.normal_(p)
    x = torch.randn(5, 16)
    out, active = moe(x)
    probs = moe.router(x).softmax(-1)
    w, idx = probs.topk(2, dim=-1)
    w = w / w.sum(-1, keepdim=True)
    want = torch.zeros_like(x)
    for t in range(5):
        for j in range(2):
            e = int(idx[t, j])
            xe = x[t : t + 1]
            y = (torch.nn.functional.silu(xe @ moe.w_gate[e]) * (xe @ moe.w_up[e])) @ moe.w_down[e]
            want[t] += w[t, j] * y[0]
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    assert active == len(set(idx.flatten().tolist()))


def test_the_engine_bench_suite_is_registered() -> None:
    from toolkit.bench import SUITES, _load

    assert SUITES["engine"] == "cluster.engines.torch.bench:run"
    assert callable(_load(SUITES["engine"]))
