"""The fast engine's static state per batch size, and the cache handle a prefill hands out."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .graphs import Captured
from .static_cache import StaticKVCache


class StaleCacheError(RuntimeError):
    """A cache handle from an earlier prefill: its static cache has been overwritten since."""


@dataclass
class DecodeState:
    """Static buffers of one batch size: the cache, the step's inputs/outputs and the graphs that use them."""

    batch: int
    cache: StaticKVCache
    token: torch.Tensor  # [B] long, the step's input token
    pos: torch.Tensor  # [1] long, the step's position (= tokens already cached)
    logits: torch.Tensor  # [B, V] float32, the step's output
    history: torch.Tensor  # [B, capacity] long, prompt + generated ids (for the n-gram ban)
    moe_impl: str
    fused: Any = None  # decode_kernels.FusedDecode at batch 1 with Triton, else None
    choice: Any = None  # choice_kernels.BatchedChoice once a step chose on the device (batched_choice 'graph')
    serial: int = 0  # bumped by every prefill; older cache handles become stale
    # the position up to which the device already holds token, pos and history after fused steps that chose on
    # the device (so the next fused call writes nothing before its replay); None when the host must set them
    primed: int | None = None
    graphs: dict[tuple, Captured] = field(default_factory=dict)  # decode step per (bucket length, kind)
    prefills: dict[tuple, dict] = field(default_factory=dict)  # prefill stages per input shape

    @property
    def capacity(self) -> int:
        return self.cache.capacity


@dataclass
class FastCache:
    """What prefill() hands out: the state plus the prefill it belongs to. The engine-interface cache:
    length, history, bytes_used, bytes_allocated."""

    state: DecodeState
    serial: int

    def check(self) -> DecodeState:
        if self.serial != self.state.serial:
            raise StaleCacheError("this cache belongs to an earlier prefill; its static buffers have been reused")
        return self.state

    @property
    def length(self) -> int:
        return self.check().cache.length  # a stale handle must not report another prefill's length

    @property
    def history(self) -> torch.Tensor:
        return self.check().history

    @property
    def bytes_used(self) -> int:
        """Bytes of keys and values in the filled positions."""
        return self.check().cache.bytes_used

    @property
    def bytes_allocated(self) -> int:
        """Bytes of the whole static cache (every slot up to its capacity)."""
        return self.check().cache.bytes_allocated
