"""benchmarks/lm_head_cast.py: the lm_head's GEMM and its cast to float32, measured and priced (CPU smoke test; the
same on a GPU)."""
from __future__ import annotations

import json

import pytest
import torch

from benchmark_scripts import load_benchmark


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_each_kernel_is_timed_and_priced(tmp_path, device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU; run on the device machine")
    out = tmp_path / "lm_head_cast.json"
    res = load_benchmark("lm_head_cast").main(["--device", device, "--rows", "4,32", "--profile",
                                               "data/profiles/h100.json", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(res))
    assert [r["rows"] for r in res["rows"]] == [4, 32]
    for r in res["rows"]:
        assert r["gemm_s"] > 0 and r["cast_s"] > 0 and r["both_s"] > 0
        assert r["cast_tb_s"] == pytest.approx(r["rows"] * 129280 * 6 / r["cast_s"] / 1e12)
        p = r["predicted"]
        assert p["tables"][0] == "gemm.bfloat16" and p["tables"][1] in ("memory.cast", "memory.elementwise")
        assert 0 < p["gemm_s"] and 0 < p["cast_s"]
    # more logits to cast take longer in the plan
    assert res["rows"][1]["predicted"]["cast_s"] > res["rows"][0]["predicted"]["cast_s"]
