"""FlopCounterMode that also counts SDPA on CPU.

torch's FlopCounterMode registers formulas for the CUDA SDPA kernels (flash, efficient, cudnn) only; on CPU,
SDPA dispatches to `_scaled_dot_product_flash_attention_for_cpu`, which it would count as 0 FLOPs. On the meta
device SDPA decomposes into two bmm and is counted anyway. Same formula as torch's: 4 * B * heads * S_q * S_kv * d
(no causal discount).
"""
from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode


def _cpu_sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    b, h, s_q, d = query_shape
    s_kv, d_v = key_shape[-2], value_shape[-1]
    return 2 * b * h * s_q * s_kv * d + 2 * b * h * s_q * s_kv * d_v


CPU_SDPA_MAPPING = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flops}


def flop_counter(display: bool = False, depth: int = 2) -> FlopCounterMode:
    """FlopCounterMode(display, depth) with the CPU SDPA formula added."""
    return FlopCounterMode(display=display, depth=depth, custom_mapping=dict(CPU_SDPA_MAPPING))
