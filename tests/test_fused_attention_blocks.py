"""The fused batch-1 attention's blocks follow the cache length (fast/decode_kernels.attention_blocks), and the
kernel computes plain attention with each of them, the long caches' included (Triton's interpreter on the CPU)."""
import importlib.util

import pytest
from triton_interpreter import interpreted_result

from dsocr_core.fast.decode_kernels import ATTENTION_BY_LENGTH, BLOCKS, attention_blocks, attention_table_slots

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="Triton is not installed: the fused kernels exist only as Triton code")


def test_the_blocks_grow_with_the_cache_and_start_from_the_short_caches_blocks():
    assert attention_blocks(1) == attention_blocks(1024) == BLOCKS["attention"] == (32, 0, 1)
    assert attention_blocks(1025) == attention_blocks(2048) == (64, 0, 2)
    assert attention_blocks(2049) == attention_blocks(16384) == (128, 0, 4)
    # the programs a head runs stay within a factor of two of the short cache's largest count
    short = 1024 // BLOCKS["attention"][0]
    for length in (1025, 2048, 2049, 4096):
        assert -(-length // attention_blocks(length)[0]) <= 2 * short
    assert ATTENTION_BY_LENGTH[-1][0] is None  # every length has blocks


def test_the_attention_table_has_lengths_on_both_sides_of_every_change_of_blocks():
    """The time model interpolates memory.fused_attention between its measured lengths: every span between two
    neighbours runs one block setting past its first length, so a change of blocks is bracketed by the lengths on
    either side of it (without the added lengths 1,025-4,096 slots would be priced between 32-slot and 128-slot
    blocks)."""
    slots = attention_table_slots()
    assert slots == sorted(set(slots)) and slots[0] <= 16 and slots[-1] >= 16384
    for lo, hi in zip(slots, slots[1:]):
        assert attention_blocks(lo + 1) == attention_blocks(hi), (lo, hi)


SCRIPT = r"""
import json
import torch
from dsocr_core.fast import decode_kernels as dk
from dsocr_core.fast.triton_kernels import next_pow2, triton

torch.manual_seed(0)
h, d, out = 2, 128, {}
for length in (700, 1500, 2100):  # one cache per rule
    chunk, _, warps = dk.attention_blocks(length)
    splits = triton.cdiv(length, chunk)
    q = torch.randn(h, d)
    kc, vc = torch.randn(h, splits * chunk, d), torch.randn(h, splits * chunk, d)
    m, l_, acc = torch.empty(h * splits), torch.empty(h * splits), torch.empty(h * splits, d)
    cnt, o = torch.zeros(h, dtype=torch.int32), torch.empty(h, d)
    pos = torch.tensor([length - 1])
    dk._attention[(h, splits)](q, kc, vc, pos, m, l_, acc, cnt, o, splits, kc.stride(0), kc.stride(1),
                               vc.stride(0), vc.stride(1), d ** -0.5, D=d, CHUNK=chunk, BS=next_pow2(splits),
                               num_warps=warps)
    p = torch.softmax((kc[:, :length] @ q[:, :, None])[..., 0] * d ** -0.5, dim=-1)
    ref = (p[:, :, None] * vc[:, :length]).sum(1)
    out[str(length)] = {"chunk": chunk, "max_abs_diff": float((o - ref).abs().max()), "counter": cnt.tolist()}
print("RESULT " + json.dumps(out))
"""


@needs_triton
def test_the_kernel_is_attention_over_the_cache_with_every_lengths_blocks():
    got = interpreted_result(SCRIPT, timeout=600)
    assert [got[n]["chunk"] for n in ("700", "1500", "2100")] == [32, 64, 128]
    for n, r in got.items():
        assert r["max_abs_diff"] < 1e-4, (n, r)  # float32 throughout
        assert r["counter"] == [0, 0], (n, r)  # each head's merge reset its arrival counter
