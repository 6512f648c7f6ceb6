"""The calibration op of the fast engine's batched decode attention (calibration/ops.py, table
attention.split_kv) on the CPU, through Triton's interpreter: it runs the engine's own split-KV kernels over every
cached key and computes what plain attention of one query computes."""
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
print("RESULT " + json.dumps({"shape": list(out.shape), "max_abs_diff": float((out.float() - ref).abs().max()),
                              "nbytes": nbytes, "kernels": kernels, "table_kernels": ATTN_KERNELS["split_kv"]}))
"""


def test_the_split_kv_op_is_attention_over_every_cached_key():
    got = interpreted_result(SCRIPT, timeout=600)
    assert got["shape"] == [1, 20, 128]
    assert got["max_abs_diff"] < 2e-2  # bf16 inputs and output
    assert got["nbytes"] == 20 * (1 + 2 * 150) * 128 * 2  # one query, the keys and values it reads
    assert got["kernels"] == got["table_kernels"] == 2  # the partial kernel and its combine
