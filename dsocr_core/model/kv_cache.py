"""Dynamic key/value cache for the LM: one [B, heads, L, head_dim] key and value tensor per layer.

Each step concatenates (torch.cat): simple and exact, fine for this reference path (a paged or preallocated
cache is the session's business).
"""
from __future__ import annotations

import torch


class KVCache:
    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []  # keys[i]: layer i, [B, heads, L, head_dim]
        self.values: list[torch.Tensor] = []

    @property
    def length(self) -> int:
        """Cached positions. Read it before a step: during a step layer 0 is already one step ahead."""
        return self.keys[0].shape[-2] if self.keys else 0

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this step's k, v [B, heads, S, d] to layer `layer`; return the layer's full k, v."""
        if layer == len(self.keys):
            self.keys.append(k)
            self.values.append(v)
        elif layer < len(self.keys):
            if self.keys[layer].shape[0] != k.shape[0]:
                raise ValueError(f"cache batch {self.keys[layer].shape[0]} != step batch {k.shape[0]}")
            self.keys[layer] = torch.cat([self.keys[layer], k], dim=-2)
            self.values[layer] = torch.cat([self.values[layer], v], dim=-2)
        else:
            raise IndexError(f"layer {layer} updated before layer {len(self.keys)}")
        return self.keys[layer], self.values[layer]

    @property
    def bytes_used(self) -> int:
        """Bytes of the cached keys and values (every position holds data)."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    @property
    def bytes_allocated(self) -> int:
        """Bytes held for the cache: the same as used, since each step reallocates to the exact length."""
        return self.bytes_used

    def __len__(self) -> int:
        return len(self.keys)
