"""The time model of DeepSeek-OCR 2: its encoder's kernel plans partition the analytic rows exactly (so with every
efficiency 1 and no launch cost the prediction is the roofline), the masked encoder attention is timed on the
masked-SDPA table, a sweep over the crop counts equals its single points, and the fast session mode, which runs
DeepSeek-OCR only, is refused with a clear error."""
from __future__ import annotations

import numpy as np
import pytest

from dsocr_core.analytic import Points, evaluate
from dsocr_core.analytic.kernels import Call
from dsocr_core.analytic.predict import PREDICTED, with_profile
from dsocr_core.analytic.stages import all_rows, decode_step_rows
from dsocr_core.calibration.profile import load_profile
from dsocr_core.cli import main
from dsocr_core.engines import as_engine
from dsocr_core.spec import SpecError, Workload
from dsocr_core.spec_v2 import OCR2Spec, tiny_spec_v2
from test_predict import H200, _profile, _random_profile

STAGES = ("sam", "encoder", "projector", "vision", "prefill", "decode", "total")
GRIDS = [(1, 1), (2, 1), (2, 2), (3, 2)]  # 0, 2, 4 and 6 crops


def _grid(**kw) -> Points:
    return Points.grid(mode="dynamic", crops=GRIDS, text_tokens=[10, 700], batch=[1, 3], decode_steps=[0, 17], **kw)


def test_efficiency_one_and_no_launch_cost_is_the_roofline():
    st = evaluate(OCR2Spec(), _grid(), with_profile(H200, _profile(), "reference", work="analytic"))
    for s in STAGES:
        np.testing.assert_allclose(st[s]["predicted_s"], st[s]["time_s"], rtol=1e-12, atol=0)
        for part in ("predicted_kernel_s", "predicted_launch_s", "predicted_host_s"):
            np.testing.assert_allclose(st[s][part], 0.0, atol=1e-18)


def test_encoder_plans_stay_within_their_rows_and_time_the_mask_on_the_masked_table():
    spec = OCR2Spec()
    pts = _grid()
    reference = as_engine("reference").kernel_plan("cuda")  # the reference engine's own plan on a GPU
    tables = set()
    for row in all_rows(spec, pts) + decode_step_rows(spec, pts, pts.sequence + 3.0):
        parts = [(row.steps[0], row.ctx[0]), (row.steps[1], row.ctx[1])] if row.steps else \
            list(zip(row.parts or (row.cost,), row.ctx))
        for cost, ctx in parts:
            pl = reference.plan(Call(row.kind, cost, ctx))
            assert np.all(sum((k.flops for k in pl.kernels), 0.0) <= cost.flops * (1 + 1e-12) + 1e-6), row.kind
            assert np.all(sum((k.nbytes for k in pl.kernels), 0.0) <= cost.bytes * (1 + 1e-12) + 1e-6), row.kind
            if row.kind == "encoder.self_attn":
                tables |= {k.table for k in pl.kernels}
    # RoPE and the k/v expansion on the broadcast table (kernels_v2.py), the mask on the masked SDPA's
    assert tables == {"gemm", "attention.sdpa_bias", "memory.broadcast"}


def test_sweep_over_crop_counts_equals_single_points():
    spec = tiny_spec_v2()
    hw = with_profile(H200, _random_profile(), "reference")
    pts = _grid()
    st = evaluate(spec, pts, hw)
    cols = pts.columns()
    for i in range(pts.size):
        grid = (int(cols["crops_w"][i]), int(cols["crops_h"][i]))
        w = Workload(mode="dynamic", crops=None if grid == (1, 1) else grid, text_tokens=int(cols["text_tokens"][i]),
                     batch=int(cols["batch"][i]), decode_steps=int(cols["decode_steps"][i]))
        one = evaluate(spec, Points.from_workload(w), hw)
        for s in STAGES:
            for k in PREDICTED:
                assert st[s][k][i] == pytest.approx(one[s][k][0], rel=1e-12, abs=1e-18), (s, k, i)


def test_bundled_profile_predicts_every_v2_stage_and_the_encoder_is_host_bound():
    profile = load_profile("data/profiles/h200.json")
    pts = Points.grid(mode="dynamic", crops=GRIDS, text_tokens=[10], decode_steps=[32])
    st = evaluate(OCR2Spec(), pts, with_profile(H200, profile, "reference"))
    for s in STAGES:
        assert np.all(np.isfinite(st[s]["predicted_s"])) and np.all(st[s]["predicted_s"] >= st[s]["time_s"]), s
    enc = st["encoder"]
    assert np.all(np.diff(enc["predicted_roofline_s"]) > 0)  # more crops, more work
    # the eager encoder is host-bound on an H200: the crops' second call doubles the host work, while their count
    # hides under it (the GPU work of 2..6 crops stays below the host time of issuing it)
    assert np.all(np.diff(enc["predicted_s"]) >= -1e-9 * enc["predicted_s"][1:])  # equal up to rounding
    assert enc["predicted_s"][1] > 1.5 * enc["predicted_s"][0]
    assert np.all(enc["predicted_host_s"] > enc["predicted_kernel_s"] + enc["predicted_roofline_s"])


def test_fast_mode_prediction_of_v2_is_refused(capsys):
    with pytest.raises(SpecError, match="fast engine runs DeepSeek-OCR only"):
        evaluate(OCR2Spec(), _grid(), with_profile(H200, _profile(), "fast"))
    assert main(["analytic", "--model", "deepseek-ocr2", "--image", "1920x1080", "--profile",
                 "data/profiles/h200.json", "--session-mode", "fast"]) == 2
    assert "predict DeepSeek-OCR 2 in the reference session mode" in capsys.readouterr().err
