"""The host cost per op of the reference model's own code, by stage (calibration/host_stages.py): measured on the
model, stored in the profile, and what the reference plan's SAM, CLIP and decode ops are priced at."""
from __future__ import annotations

import numpy as np
import pytest

from dsocr_core.analytic import Points, evaluate
from dsocr_core.analytic.predict import with_profile
from dsocr_core.calibration.host_stages import host_costs_by_stage
from dsocr_core.calibration.profile import ProfileError, add_tables, load_profile, profile_from_dict, uniform_profile
from dsocr_core.registry import HOST_COST_STAGES
from dsocr_core.engines import EngineSpec
from dsocr_core.hardware import get_hardware
from dsocr_core.spec import ModelSpec, tiny_spec

H100 = get_hardware("h100-sxm")
PTS = Points.build(mode="gundam", crops=(2, 1), text_tokens=10, batch=1, decode_steps=4, logits="last")


def _profile(stage_costs=None, host=20e-6):
    d = uniform_profile(H100.peak_flops, H100.bandwidth, 0.5, 0.0, kind="cuda").to_dict()
    d["launch"].update(host_op_s=host, host_op_s_by_kind={k: host for k in ("gemm", "attention", "other", "view")})
    if stage_costs is not None:
        d["launch"]["host_op_s_by_stage"] = stage_costs
    return profile_from_dict(d)


def test_the_calibration_times_each_stage_of_the_model_per_launching_op():
    costs = host_costs_by_stage("cpu", spec=tiny_spec(), repeats=1, mode="tiny", grid=(1, 1))
    assert set(costs) == set(HOST_COST_STAGES)
    assert all(0 < v < 1.0 for v in costs.values())


def test_the_reference_plans_sam_clip_and_decode_ops_take_the_stage_costs():
    engine = EngineSpec.of("reference")
    base = evaluate(ModelSpec(), PTS, with_profile(H100, _profile(), engine))
    costly = evaluate(ModelSpec(), PTS, with_profile(H100, _profile({"sam": 1e-3, "clip": 2e-3, "decode": 1e-3}),
                                                     engine))
    for stage in ("sam", "clip", "decode"):  # host-bound at 1-2 ms per op: every op's cost is the stage's
        assert costly[stage]["predicted_s"][0] > 20 * base[stage]["predicted_s"][0]
    double = evaluate(ModelSpec(), PTS, with_profile(H100, _profile({"sam": 1e-3, "clip": 4e-3, "decode": 1e-3}),
                                                     engine))
    assert double["clip"]["predicted_s"][0] == pytest.approx(2 * costly["clip"]["predicted_s"][0], rel=1e-3)
    for stage in ("projector", "prefill"):  # priced by kind, as before
        np.testing.assert_allclose(costly[stage]["predicted_s"], base[stage]["predicted_s"], rtol=1e-12)
    fast = EngineSpec.of("fast")  # the fast engine's few eager ops are not the model's code: by kind
    a = evaluate(ModelSpec(), PTS, with_profile(H100, _profile({"sam": 1e-3, "clip": 2e-3, "decode": 1e-3}), fast))
    b = evaluate(ModelSpec(), PTS, with_profile(H100, _profile(), fast))
    for stage in ("sam", "clip", "decode"):
        np.testing.assert_allclose(a[stage]["predicted_s"], b[stage]["predicted_s"], rtol=1e-12)


def test_a_profile_without_them_prices_by_kind_and_says_so():
    hw = with_profile(H100, _profile(), EngineSpec.of("reference"))
    evaluate(ModelSpec(), PTS, hw)
    assert any("launch.host_stages" in n for n in hw.prediction.notes)
    hw = with_profile(H100, _profile({"sam": 2e-5, "clip": 2e-5, "decode": 2e-5}), EngineSpec.of("reference"))
    evaluate(ModelSpec(), PTS, hw)
    assert not any("launch.host_stages" in n for n in hw.prediction.notes)


def test_the_profile_stores_them_and_refuses_unknown_or_bad_stages(tmp_path):
    p = _profile({"sam": 2e-5, "clip": 3e-5, "decode": 1e-5})
    back = load_profile(p.save(tmp_path / "p.json"))
    assert back.host_stage_costs == {"sam": 2e-5, "clip": 3e-5, "decode": 1e-5}
    assert _profile().host_stage_costs == {} and "host_op_s_by_stage" not in _profile().raw["launch"]
    with pytest.raises(ProfileError, match="host_op_s_by_stage"):
        _profile({"projector": 1e-5})
    with pytest.raises(ProfileError, match="host_op_s_by_stage.sam"):
        _profile({"sam": -1.0})
    added = add_tables(_profile(), {}, {"name": p.device_name}, {}, {}, "2026-11-27T00:00:00+00:00",
                       launch={"host_op_s_by_stage": {"sam": 2e-5, "clip": 2e-5, "decode": 2e-5}})
    assert added.host_stage_costs["clip"] == 2e-5 and "launch.host_stages" in added.label()
