"""The host's speed (runtime/host_speed.py): probed beside every measured point and beside the host costs a
calibration measures, and a measured point predicted at its own speed (the host costs scaled by the two probes)."""
from __future__ import annotations

import numpy as np
import pytest

from dsocr_core.analytic import Points, evaluate
from dsocr_core.analytic.predict import HOST_AS_CALIBRATED, at_host_speed, with_profile
from dsocr_core.calibration.profile import ProfileError, add_tables, load_profile, profile_from_dict, uniform_profile
from dsocr_core.engines import EngineSpec
from dsocr_core.hardware import get_hardware
from dsocr_core.results.analytic_join import compare_run
from dsocr_core.runtime.host_speed import probe_host_op_s
from dsocr_core.spec import ModelSpec, Workload

H100 = get_hardware("h100-sxm")
PTS = Points.build(mode="tiny", text_tokens=10, batch=1, decode_steps=4, logits="last")
STAGES = ("sam", "clip", "projector", "prefill", "decode")


def _profile(kinds_probe=None, stages_probe=None):
    d = uniform_profile(H100.peak_flops, H100.bandwidth, 0.5, 0.0, kind="cuda").to_dict()
    d["launch"].update(host_op_s=20e-6, host_op_s_by_kind={k: 20e-6 for k in ("gemm", "attention", "other", "view")},
                       host_op_s_by_stage={"sam": 25e-6, "clip": 25e-6, "decode": 25e-6})
    if kinds_probe is not None:
        d["launch"]["host_probe_op_s"] = kinds_probe
    if stages_probe is not None:
        d["launch"]["host_stage_probe_op_s"] = stages_probe
    return profile_from_dict(d)


def _host(hw):
    out = evaluate(ModelSpec(), PTS, hw)
    return {s: float(out[s]["predicted_host_s"][0]) for s in STAGES}, {s: float(out[s]["predicted_s"][0])
                                                                      for s in STAGES}


def test_a_point_on_a_slower_host_is_predicted_slower_by_the_probes_ratio():
    prof = _profile(kinds_probe=10e-6, stages_probe=10e-6)
    engine = EngineSpec.of("reference")
    hw = with_profile(H100, prof, engine)
    host, total = _host(hw)
    assert hw.prediction.host_label() == HOST_AS_CALIBRATED
    assert all(host[s] > 0 for s in STAGES)  # the reference path at batch 1 is host-bound in every stage
    slow = at_host_speed(hw, 20e-6)  # the point's host took twice the calibration's time per op
    assert "2.00x" in slow.prediction.host_label()
    host2, total2 = _host(slow)
    for s in STAGES:  # each call takes max(device, host): twice the host time is at most twice the call
        assert total[s] < total2[s] <= 2 * total[s] * (1 + 1e-9)
        assert host2[s] > host[s]
        if host[s] > 0.9 * total[s]:  # host-bound stages: almost twice as long
            assert total2[s] > 1.8 * total[s]
    assert at_host_speed(hw, None) is hw


def test_without_a_probe_on_either_side_nothing_is_scaled():
    engine = EngineSpec.of("reference")
    _, base = _host(with_profile(H100, _profile(), engine))
    _, no_profile_probe = _host(with_profile(H100, _profile(), engine, host_probe_op_s=30e-6))
    _, no_point_probe = _host(with_profile(H100, _profile(10e-6, 10e-6), engine))
    for s in STAGES:
        assert no_profile_probe[s] == pytest.approx(base[s], rel=1e-12)
        assert no_point_probe[s] == pytest.approx(base[s], rel=1e-12)


def test_kind_and_stage_costs_scale_by_their_own_calibration_probe():
    engine = EngineSpec.of("reference")
    prof = _profile(kinds_probe=10e-6, stages_probe=20e-6)
    base, _ = _host(with_profile(H100, prof, engine))
    at, _ = _host(with_profile(H100, prof, engine, host_probe_op_s=20e-6))
    # SAM, CLIP and decode are priced at the model's costs by stage (measured at 20 us: ratio 1); the projector and
    # the LM prefill by kind (measured at 10 us: ratio 2)
    for s in ("sam", "clip", "decode"):
        assert at[s] == pytest.approx(base[s], rel=1e-9)
    for s in ("projector", "prefill"):
        assert at[s] > 1.5 * base[s]


def test_the_profile_keeps_the_probes_and_refuses_bad_ones(tmp_path):
    p = _profile(12e-6, 16e-6)
    back = load_profile(p.save(tmp_path / "p.json"))
    assert back.host_probe("kinds") == 12e-6 and back.host_probe("stages") == 16e-6
    assert _profile().host_probe("kinds") is None and "host_probe_op_s" not in _profile().raw["launch"]
    with pytest.raises(ProfileError, match="host_probe_op_s"):
        _profile(kinds_probe=-1.0)
    added = add_tables(_profile(), {}, {"name": p.device_name}, {}, {}, "2026-11-27T00:00:00+00:00",
                       launch={"host_op_s_by_kind": {"gemm": 1e-5, "attention": 1e-5, "other": 1e-5, "view": 1e-6},
                               "host_op_s": 1e-5, "host_probe_op_s": 9e-6})
    assert added.host_probe("kinds") == 9e-6 and "launch.host_kinds" in added.label()
    assert added.raw["launch"]["host_op_s"] == 1e-5
    for launch in ({"sync_s": 1e-6}, {"host_probe_op_s": 9e-6, "host_op_s": 1e-5}):  # companions need their cost
        with pytest.raises(ProfileError, match="cannot be added"):
            add_tables(_profile(), {}, {"name": p.device_name}, {}, {}, "2026-11-27T00:00:00+00:00", launch=launch)
    with pytest.raises(ProfileError, match="host_stage_probe_op_s must be a positive"):
        _profile(stages_probe=0.0)


def test_the_probe_is_a_gpu_measurement():
    assert probe_host_op_s("cpu") is None


@pytest.mark.gpu
def test_the_probe_times_small_eager_ops_on_the_gpu():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    v = probe_host_op_s("cuda")
    assert 5e-7 < v < 1e-3  # microseconds per op on any real host


def test_a_stored_points_probe_sets_its_predicted_host_speed(tmp_path):
    from dsocr_core.results.store import RunStore

    store = RunStore(tmp_path / "runs.sqlite")
    run_id = store.create_run("sweep", "host speed", {"device": "NVIDIA H100 80GB HBM3", "kind": "cuda"},
                              {"source": "synthetic"}, dtype="bfloat16", attn="sdpa", session_mode="reference")
    stage = {"median_s": 0.01, "p10_s": 0.01, "p90_s": 0.01, "min_s": 0.01, "max_s": 0.01, "n": 3}
    for i, probe in enumerate((10e-6, 20e-6, None)):
        w = Workload(mode="tiny", text_tokens=10 + i, batch=1, decode_steps=4, logits="last")
        extra = {"engine_state": {}} if probe is None else {"engine_state": {}, "host_probe_op_s": probe}
        store.put_point(run_id, w, "done", "", {"sam": dict(stage), "prefill": dict(stage)}, 0,
                        {"sequence": 100}, extra)
    hw = with_profile(H100, _profile(10e-6, 10e-6), "reference")
    df = compare_run(store, run_id, prediction=hw)
    by_text = {t: g for t, g in df.groupby("text_tokens")}
    assert set(by_text[10].predicted_host_speed) == {"measured with the point: 1.00x (op kinds), 1.00x (the "
                                                     "model's code) the calibration's host time per op"}
    assert "2.00x" in by_text[11].predicted_host_speed.iloc[0]
    assert set(by_text[12].predicted_host_speed) == {HOST_AS_CALIBRATED}
    sam = {t: float(g[g.stage == "sam"].predicted_s.iloc[0]) for t, g in by_text.items()}
    assert sam[11] > 1.5 * sam[10] and sam[12] == pytest.approx(sam[10], rel=1e-9)
    assert np.isfinite(df.time_err_predicted).all()
    # a profile without probes scales nothing and says so for every point, probed or not
    plain = compare_run(store, run_id, prediction=with_profile(H100, _profile(), "reference"))
    assert set(plain.predicted_host_speed) == {HOST_AS_CALIBRATED}
    sam = plain[plain.stage == "sam"].predicted_s.to_numpy()
    np.testing.assert_allclose(sam, sam[0], rtol=1e-12)


def test_the_points_of_a_run_share_predictions_to_one_percent_of_the_host_speed():
    hw = with_profile(H100, _profile(10e-6, 10e-6), "reference")
    a, b = at_host_speed(hw, 12.01e-6), at_host_speed(hw, 11.99e-6)
    assert a.prediction.host_probe_op_s == b.prediction.host_probe_op_s == pytest.approx(12e-6, rel=1e-12)
    assert at_host_speed(with_profile(H100, _profile(), "reference"), 12e-6).prediction.host_probe_op_s is None
    fast = with_profile(H100, _profile(kinds_probe=10e-6, stages_probe=20e-6), "fast", host_probe_op_s=20e-6)
    label = fast.prediction.host_label()  # each host-cost table against its own probe
    assert "2.00x (op kinds)" in label and "1.00x (the model's code)" in label
