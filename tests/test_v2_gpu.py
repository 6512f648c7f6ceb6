"""DeepSeek-OCR 2 at full size (bf16 synthetic weights) on a CUDA GPU: separated prefill + decode token-exact
against one-shot generation on real page sizes, FLOPs counted on the GPU equal to the analytic model's, and a
measured sweep over the crop counts with every stage timed and joined to the analytic (and, with the bundled
profile, the predicted) time. Run on the device machine: `pytest -m gpu tests/test_v2_gpu.py -s`."""
import pytest
import torch
from PIL import Image

from dsocr_core.analytic import stage_totals
from dsocr_core.measure.parity_run import run_parity
from dsocr_core.measure.sweep import run_sweep, sweep_workloads
from dsocr_core.results.analytic_join import compare_run
from dsocr_core.results.store import RunStore
from dsocr_core.runtime.session import Session
from dsocr_core.spec import Workload
from dsocr_core.spec_v2 import OCR2Spec

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def session():
    return Session.load(synthetic="full", model="deepseek-ocr2", device="cuda", dtype="bfloat16")


@pytest.mark.parametrize("size,slots", [((1920, 1080), 545), ((1024, 1024), 833), ((1191, 1684), 1121)])
def test_full_v2_separated_equals_one_shot(session, size, slots):
    report = run_parity(session, Image.new("RGB", size, (235, 235, 235)), max_new_tokens=64)
    print(size, report.timings())
    assert report.prompt_tokens - slots > 0 and report.mode == "dynamic"
    assert report.token_equal and report.passed, report.separated.verification


@pytest.mark.parametrize("size", [(640, 480), (1920, 1080), (1191, 1684)])  # 0, 2 and 6 crops
def test_full_v2_flops_exact_on_gpu(session, size):
    """FlopCounterMode's count of every stage of a real page on the GPU (bf16) = the analytic model's."""
    inputs = session.prepare(Image.new("RGB", size, (200, 200, 200)))
    counted = session.count_stage_flops(inputs, logits="all", decode_steps=1)
    grid = tuple(int(v) for v in inputs.images_spatial_crop[0].tolist())
    totals = stage_totals(OCR2Spec(), Workload(mode="dynamic", crops=None if grid == (1, 1) else grid,
                                               text_tokens=inputs.seq_len - inputs.image_slots, logits="all"))
    for stage in ("sam", "encoder", "projector", "prefill"):
        assert counted[stage]["flops"] == totals[stage]["tensor_flops"], (size, stage)


def test_full_v2_measured_sweep_is_timed_and_joined(session, tmp_path):
    store = RunStore(tmp_path / "runs.sqlite")
    grids = [(1, 1), (2, 1), (2, 2), (3, 2)]  # 0, 2, 4 and 6 crops
    run_id = run_sweep(session, store, sweep_workloads(["dynamic"], grids, [10], [1], [32]), repeats=3, warmup=1)
    joined = compare_run(store, run_id)
    stages = joined[joined["stage"].isin(["sam", "encoder", "projector", "prefill", "decode"])]
    print(stages[["grid", "stage", "measured_s", "predicted_datasheet_s", "mfu_datasheet"]].to_string())
    assert (stages["measured_s"] > 0).all()
    assert (stages.dropna(subset=["measured_tensor_flops"])["flop_rel_diff"].abs() == 0).all()
    enc = joined[joined["stage"] == "encoder"].set_index("grid")["measured_s"]
    assert enc["3x2"] > enc["1x1"]  # six crops: more encoder time than the global view alone
    assert torch.cuda.max_memory_allocated() > 0
