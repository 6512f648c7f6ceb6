"""The same pages under both models (analytic.models): each family tiles the page its own way and prices it with
its own spec, the figures are those of each family's own analytic model, and a fast-mode prediction of the model
the fast engine does not run falls back to the reference mode, labelled."""
import numpy as np
import pytest

from dsocr_core.analytic import stage_totals
from dsocr_core.analytic.models import COLUMNS, model_summary, models_on_pages
from dsocr_core.analytic.predict import with_profile
from dsocr_core.calibration.profile import profile_from_dict
from dsocr_core.hardware import get_hardware
from dsocr_core.spec import ModelSpec, Workload
from dsocr_core.spec_v2 import OCR2Spec
from test_predict import _profile

H200 = get_hardware("h200")


def test_each_model_tiles_and_prices_the_page_its_own_way():
    long = models_on_pages([(1920, 1080), (1191, 1684), (640, 480)], H200, decode_steps=64)
    assert tuple(long.columns) == COLUMNS
    assert list(dict.fromkeys(long["page"])) == ["1920x1080", "1191x1684", "640x480"]  # the order given
    first = long[long["page"] == "1920x1080"]
    v1, v2 = first[first["model"] == "deepseek-ocr"], first[first["model"] == "deepseek-ocr2"]
    assert list(v1["stage"]) == ["sam", "clip", "projector", "vision", "prefill", "decode", "total"]
    assert list(v2["stage"]) == ["sam", "encoder", "projector", "vision", "prefill", "decode", "total"]
    assert set(v2["image_slots"]) == {545} and set(v2["grid"]) == {"2x1"}
    for spec, rows, mode, crops in ((ModelSpec(), v1, "gundam", None), (OCR2Spec(), v2, "dynamic", None)):
        st = stage_totals(spec, Workload(mode=mode, crops=crops, image_size=(1920, 1080), decode_steps=64), H200)
        for r in rows.itertuples():
            assert r.flops == st[r.stage]["flops"] and r.time_s == pytest.approx(st[r.stage]["time_s"], rel=1e-12)
    small = long[(long["page"] == "640x480") & (long["model"] == "deepseek-ocr2")]
    assert set(small["image_slots"]) == {257}  # <= 768 px: the global view only
    summary = model_summary(long)
    assert len(summary) == 6 and summary["total_flops"].gt(0).all()
    assert np.isnan(long["predicted_s"]).all()


def test_fast_prediction_of_v2_is_made_in_the_reference_mode_and_says_so():
    long = models_on_pages([(1024, 1024)], with_profile(H200, _profile(), "fast"))
    modes = long.groupby("model")["predicted_mode"].first()
    assert modes["deepseek-ocr"] == "fast" and modes["deepseek-ocr2"] == "reference"
    assert long["predicted_s"].notna().all()


def test_a_what_if_clock_reaches_every_model_and_its_export():
    """The reference-mode prediction of a model the fast engine does not run keeps the what-if SM clock (and the
    routing) of the fast one, and every row names both."""
    from dsocr_core.analytic.predict import at_sm_clock

    raw = _profile().to_dict()
    raw["environment"] = {"sm_clock_max_mhz": 2000.0}
    hw = with_profile(H200, profile_from_dict(raw), "fast")
    full, slow = (models_on_pages([(1024, 1024)], h) for h in (hw, at_sm_clock(hw, 1000.0)))
    totals = lambda t: t[t["stage"] == "total"].set_index("model")["predicted_s"]  # noqa: E731
    assert (totals(slow) > totals(full) * (1 + 1e-6)).all()  # both models: DeepSeek-OCR 2 in the reference mode too
    assert slow["predicted_clocks"].eq("what-if: SM 1,000 MHz in every stage against the calibration's 2,000 MHz"
                                       ).all()
    assert full["predicted_routing"].eq("uniform (assumed)").all()
