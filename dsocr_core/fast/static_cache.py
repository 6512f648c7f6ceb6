"""A preallocated KV cache: per layer one key and one value tensor [B, heads, capacity, head_dim], written in
place. Separate tensors (not views of one block) so a compiled function that writes a layer's keys and values
sees two independent inputs (no aliasing for torch.compile to untangle).

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
        shape = (batch, heads, capacity, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.length = 0  # positions filled (host counter; the device never reports it back)

    @property
    def batch(self) -> int:
        return self.k[0].shape[0]

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2]

    def layer_keys(self, layer: int, upto: int | None = None) -> torch.Tensor:
        """[B, heads, upto, d] view of layer `layer`'s keys (the whole capacity when upto is None)."""
        return self.k[layer] if upto is None else self.k[layer][:, :, :upto]

    def layer_values(self, layer: int, upto: int | None = None) -> torch.Tensor:
        return self.v[layer] if upto is None else self.v[layer][:, :, :upto]

    def copy_from(self, other: "StaticKVCache", length: int) -> None:
        for dst, src in zip(self.k + self.v, other.k + other.v):
            dst[:, :, :length].copy_(src[:, :, :length])
        self.length = length

    @property
    def bytes_allocated(self) -> int:
        """Bytes held: the whole capacity, not just the filled part."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    @property
    def bytes_used(self) -> int:
        """Bytes of the filled positions' keys and values."""
        return self.bytes_allocated * self.length // self.capacity

    def __len__(self) -> int:
        return len(self.k)
