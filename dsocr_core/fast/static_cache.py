"""A preallocated KV cache: one [layers, 2, B, heads, capacity, head_dim] tensor, written in place.

The decode step writes its new key/value at the device-side position and attends over a fixed-size prefix
(a length bucket), so its shapes and addresses never change and the step can be captured in a CUDA graph.
Slots are zero-initialised: masked slots must hold finite values (0 * NaN would poison the attention sum).
"""
from __future__ import annotations

import torch


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


class StaticKVCache:
    def __init__(self, layers: int, batch: int, heads: int, capacity: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str):
        self.kv = torch.zeros(layers, 2, batch, heads, capacity, head_dim, dtype=dtype, device=device)
        self.length = 0  # positions filled (host counter; the device never reports it back)

    @property
    def batch(self) -> int:
        return self.kv.shape[2]

    @property
    def capacity(self) -> int:
        return self.kv.shape[4]

    def keys(self, layer: int, upto: int | None = None) -> torch.Tensor:
        """[B, heads, upto, d] view of layer `layer`'s keys."""
        return self.kv[layer, 0, :, :, :upto]

    def values(self, layer: int, upto: int | None = None) -> torch.Tensor:
        return self.kv[layer, 1, :, :, :upto]

    @property
    def nbytes(self) -> int:
        """Bytes allocated (the whole capacity, not just the filled part)."""
        return self.kv.numel() * self.kv.element_size()

    def filled_bytes(self) -> int:
        return self.nbytes * self.length // self.capacity

    def __len__(self) -> int:
        return self.kv.shape[0]
