"""The engine's KV memory: device (L1) and host (L2) pages of K and V (paper 000 §4.2).

Both tiers are one tensor each, [layers, 2 (K, V), pages, page_size, kv_heads, head_dim], so
a layer's K (or V) is one contiguous [pages * page_size, kv_heads, head_dim] view that
attention gathers from and new tokens are written into by flat slot. Copies between the
tiers (write-through, restore) and the PD transfer move whole pages across all layers.
On CUDA the host tier is pinned memory. This module owns the tensors only; which page
holds what, and which pages are free, is `prefix_cache.PrefixCache`'s business.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from cluster.engines.torch.config import ModelConfig


class KVPool:
    def __init__(
        self,
        model: ModelConfig,
        page_size: int,
        gpu_pages: int,
        host_pages: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.page_size = page_size
        self.device = device
        self.dtype = dtype
        shape = (model.num_layers, 2)
        tail = (page_size, model.num_kv_heads, model.head_dim)
        # Zeros, not empty: padded attention slots read these and must hold finite values.
        self.gpu = torch.zeros((*shape, gpu_pages, *tail), device=device, dtype=dtype)
        pin = device.type == "cuda"
        self.host = torch.zeros((*shape, host_pages, *tail), dtype=dtype, pin_memory=pin)
        self._flat_shape = (gpu_pages * page_size, model.num_kv_heads, model.head_dim)

    @property
    def page_bytes(self) -> int:
        """Bytes of one page over all layers (K and V)."""
        return self.gpu[:, :, 0].numel() * self.gpu.element_size()

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's K and V pools as [slots, kv_heads, head_dim] views."""
        return self.gpu[layer, 0].view(self._flat_shape), self.gpu[layer, 1].view(self._flat_shape)

    def write(
        self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        k_pool, v_pool = self.layer(layer)
        k_pool.index_copy_(0, slots, k)
        v_pool.index_copy_(0, slots, v)
        return k_pool, v_pool

    def to_host(self, gpu_pages: Sequence[int], host_pages: Sequence[int]) -> None:
        if gpu_pages:
            src = self.gpu[:, :, self._index(gpu_pages)]
            self.host.index_copy_(2, torch.tensor(list(host_pages)), src.to("cpu"))

    def to_gpu(self, host_pages: Sequence[int], gpu_pages: Sequence[int]) -> None:
        if host_pages:
            src = self.host[:, :, torch.tensor(list(host_pages))]
            self.gpu.index_copy_(2, self._index(gpu_pages), src.to(self.device, non_blocking=True))

    def read(self, pages: Sequence[int]) -> torch.Tensor:
        """A CPU copy of `pages` [layers, 2, n, page_size, kv_heads, head_dim]."""
        return self.gpu[:, :, self._index(pages)].to("cpu")

    def load(self, pages: Sequence[int], data: torch.Tensor) -> None:
        """Write `data` (as `read` returns it) into `pages`."""
        self.gpu.index_copy_(2, self._index(pages), data.to(self.device, self.dtype))

    def _index(self, pages: Sequence[int]) -> torch.Tensor:
        return torch.tensor(list(pages), dtype=torch.long, device=self.device)
