"""The calibration's host costs on a GPU: one per kind of eager op (GEMM, attention, other launching ops, views),
measured with the GPU kept busy so the loop times the host alone. Run on the device machine:
`python -m pytest -m gpu tests/test_calibration_gpu.py`."""
import pytest
import torch

from dsocr_core.calibration.microbench import launch_costs
from dsocr_core.calibration.ops import Settings
from dsocr_core.calibration.schema import HOST_KINDS

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def costs():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    st = Settings(device="cuda", quick=True, budget_s=60, flops_cap=1e12, memory_cap=1e9, target_s=1e-3, repeats=5,
                  max_inner=1000, l2_bytes=50 * 2**20)
    return launch_costs(st)


def test_host_cost_of_every_kind_is_measured_and_plausible(costs):
    by_kind = costs["host_op_s_by_kind"]
    assert set(by_kind) == set(HOST_KINDS)
    assert all(1e-7 < v < 1e-3 for v in by_kind.values()), by_kind  # microseconds, not nothing, not milliseconds
    assert by_kind["view"] < by_kind["gemm"], by_kind  # a view launches nothing; a Linear goes through cuBLAS


def test_the_mean_host_cost_lies_among_the_launching_kinds(costs):
    launching = [costs["host_op_s_by_kind"][k] for k in ("gemm", "attention", "other")]
    assert 0.5 * min(launching) <= costs["host_op_s"] <= 1.5 * max(launching), costs


def test_sams_dense_bias_tables_are_measured_in_cuda_graphs():
    """bias.broadcast and bias.strided run through the same capture-and-replay timing as every table (their inputs
    and the strided copy's allocation inside a CUDA graph); every entry of a small grid is measured, none is faster
    than the bandwidth allows."""
    from dsocr_core.calibration.microbench import run_microbench

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    prof = run_microbench("cuda", quick=True, budget_s=60, tables=["gemm.bfloat16", "bias.broadcast", "bias.strided"])
    for name in ("bias.broadcast", "bias.strided"):
        t = prof.table(name)
        assert t is not None and t.measured.all(), name
        assert ((t.efficiency > 0) & (t.efficiency <= 1.0)).all(), (name, t.efficiency)


def test_the_host_cost_of_the_models_own_ops_is_measured_per_stage():
    """calibration/host_stages.py on the GPU (a small model here; the calibration builds the full-size one): one
    plausible cost per launching op for each stage it prices, the device synchronised between stages."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from dsocr_core.calibration.host_stages import host_costs_by_stage
    from dsocr_core.registry import HOST_COST_STAGES
    from dsocr_core.spec import tiny_spec

    costs = host_costs_by_stage("cuda", spec=tiny_spec(), repeats=2, mode="tiny", grid=(1, 1))
    assert set(costs) == set(HOST_COST_STAGES)
    assert all(1e-6 < v < 1e-3 for v in costs.values()), costs


def test_the_fused_lm_head_table_is_measured_with_the_engines_kernel():
    """memory.fused_lm_head times the fused batch-1 step's own lm_head kernel (fast/decode_kernels.py) by the bytes
    the plan counts; every entry of its grid is measured (1 MB to 512 MB of weight) and none runs faster than the
    bandwidth allows."""
    from dsocr_core.calibration.microbench import run_microbench
    from dsocr_core.calibration.ops import FUSED_WIDTH, kernel_op

    if not torch.cuda.is_available() or not any(g in torch.cuda.get_device_name() for g in ("H100", "H200")):
        pytest.skip("needs an H100 or an H200 (the shipped profiles' GPUs, whose ceilings the table is measured on)")
    make, run, nbytes, kernels = kernel_op("memory.fused_lm_head", {"bytes": 129280 * FUSED_WIDTH * 2}, "cuda", 64)
    run(make())
    torch.cuda.synchronize()
    assert kernels == 1 and nbytes == (129280 * FUSED_WIDTH + 2 * FUSED_WIDTH) * 2  # one input set's bytes
    prof = run_microbench("cuda", quick=False, budget_s=60, tables=["memory.fused_lm_head"],
                          add_to=_shipped_profile())
    t = prof.table("memory.fused_lm_head")
    assert t is not None and t.measured.all()
    assert ((t.efficiency > 0) & (t.efficiency <= 1.0)).all(), t.efficiency


def _shipped_profile():
    from pathlib import Path

    from dsocr_core.calibration.profile import load_profile

    name = "h200.json" if "H200" in torch.cuda.get_device_name() else "h100.json"
    return load_profile(Path(__file__).resolve().parents[1] / "data" / "profiles" / name)
