"""benchmarks/decode_loop_gap.py: the trace's arithmetic on the CPU, the whole benchmark on a GPU."""
from __future__ import annotations

import pytest
import torch

from benchmark_scripts import load_benchmark


def test_busy_and_idle_time_per_step_from_overlapping_kernels():
    gap = load_benchmark("decode_loop_gap")
    events = [  # two steps: an embedding kernel, two overlapping kernels, a gap, one more kernel
        (0.0, 2.0, "triton_poi_fused_embedding_0"), (2.0, 10.0, "gemm"), (5.0, 3.0, "copy"), (20.0, 5.0, "norm"),
        (30.0, 2.0, "triton_poi_fused_embedding_0"), (32.0, 10.0, "gemm"), (50.0, 5.0, "norm"),
    ]
    out = gap.gap_summary(events)
    assert out["steps_traced"] == 2
    assert out["busy_us_per_step"] == pytest.approx((12 + 5 + 12 + 5) / 2)
    assert out["idle_us_per_step"] == pytest.approx((8 + 5 + 8) / 2)
    largest = out["largest_gaps"][0]
    assert largest["between"] == "gemm -> norm" and largest["us_per_step"] == pytest.approx(8.0)
    assert out["largest_gaps"][1]["between"] == "norm -> triton_poi_fused_embedding_0"


def test_it_says_it_needs_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the GPU test runs the benchmark")
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        load_benchmark("decode_loop_gap").main(["--batches", "2"])


@pytest.mark.gpu
def test_the_loop_step_is_the_replay_plus_what_runs_outside_it(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    out = load_benchmark("decode_loop_gap").main(["--batches", "2", "--steps", "12", "--out",
                                                   str(tmp_path / "gap.json")])
    row = out["batches"]["2"]
    assert row["replay_us"] > 0 and row["loop_step_us"] >= 0.9 * row["replay_us"]
    assert 0 < row["host_issue_us"] and row["busy_us_per_step"] > 0 and row["steps_traced"] >= 8
