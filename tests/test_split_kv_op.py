"""The calibration op of the fast engine's batched decode attention (calibration/ops.py, table
attention.split_kv) on the CPU, through Triton's interpreter: it runs the engine's own split-KV kernels over every
cached key before the position and computes what plain attention of one query computes, also where the static cache
runs on past the position (the table's fill axis)."""
import importlib.util

import pytest
from triton_interpreter import interpreted_result

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="Triton is not installed: the split-KV kernels exist only as Triton code")

SCRIPT = r"""
import json
import torch
import torch.nn.functional as F
from dsocr_core.calibration.ops import ATTN_KERNELS, kernel_op

make, run, nbytes, kernels = kernel_op("attention.split_kv", {"bh": 20, "q": 1, "k": 150, "d": 128}, "cpu", 64)
q, k, v = make()
out = run((q, k, v))
ref = F.scaled_dot_product_attention(q.float()[:, :, None], k.float(), v.float())[:, :, 0]
# the same position in a static cache twice as long (fill 0.5): the chunks past it change nothing
make2, run2, nbytes2, _ = kernel_op("attention.split_kv", {"bh": 20, "q": 1, "k": 150, "d": 128, "fill": 0.5},
                                    "cpu", 64)
q2, k2, v2 = make2()
out2 = run2((q2, k2, v2))
ref2 = F.scaled_dot_product_attention(q2.float()[:, :, None], k2.float()[:, :, :150], v2.float()[:, :, :150])[:, :, 0]
print("RESULT " + json.dumps({"shape": list(out.shape), "max_abs_diff": float((out.float() - ref).abs().max()),
                              "nbytes": nbytes, "kernels": kernels, "table_kernels": ATTN_KERNELS["split_kv"],
                              "half_cache": list(k2.shape),
                              "half_max_abs_diff": float((out2.float() - ref2).abs().max()),
                              "half_nbytes": nbytes2}))
"""


def test_the_split_kv_op_is_attention_over_every_cached_key():
    got = interpreted_result(SCRIPT, timeout=600)
    assert got["shape"] == [1, 20, 128]
    assert got["max_abs_diff"] < 2e-2  # bf16 inputs and output
    assert got["nbytes"] == 20 * (1 + 2 * 150) * 128 * 2  # one query, the keys and values it reads
    assert got["kernels"] == got["table_kernels"] == 2  # the partial kernel and its combine
    # with the position at half the cache's length: a cache of 300 slots, attention over the first 150 only, and
    # the same bytes read (the table's efficiency is of the bytes before the position)
    assert got["half_cache"] == [1, 20, 300, 128]
    assert got["half_max_abs_diff"] < 2e-2 and got["half_nbytes"] == got["nbytes"]
