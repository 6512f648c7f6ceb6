"""The reference MoE's expert loop priced one expert at a time (runtime/reference_plan.py expert_segments,
analytic/kernels.py Plan.segments, analytic/predict.py): where the routing recorded how many rows each expert got,
host and device time overlap within each expert only, so the experts holding few rows leave their host time
uncovered even when the heavy ones keep the GPU busier than the host overall."""
from pathlib import Path

import numpy as np
import pytest

from dsocr_core.analytic.kernels import Call
from dsocr_core.analytic.points import Points
from dsocr_core.analytic.predict import predictor_for, profile_hardware, with_profile
from dsocr_core.analytic.routing import Routing
from dsocr_core.analytic.stages import prefill_rows
from dsocr_core.calibration.profile import load_profile
from dsocr_core.results.prediction_check import predicted_stages
from dsocr_core.runtime.op_count import FixedRouting
from dsocr_core.runtime.reference_plan import expert_segments
from dsocr_core.spec import ModelSpec, Workload

PROFILE = Path(__file__).resolve().parents[1] / "data" / "profiles" / "h200.json"
E, K = 64, 6
TOKENS = (256.0, 8192.0)  # the prefills at batch 4 and 12 below (about 1,900 and 5,700 tokens) lie between


def routing(shape: list[float] | None, distinct: float = 16.0) -> Routing:
    """`distinct` experts at both token counts; each rank's share of the rows `shape` (None: no loads recorded)."""
    shapes = None if shape is None else (tuple(shape),) * 2
    return Routing(E, K, TOKENS, (distinct, distinct), (1, 1), "test", shapes)


EVEN = [1 / 16] * 16 + [0.0] * 48
SKEWED = [0.4, 0.2, 0.1] + [0.3 / 13] * 13 + [0.0] * 48  # three experts hold 70% of the rows, the others a few each


def experts_call(r) -> Call:
    spec = ModelSpec()
    pts = Points.build(mode="base", text_tokens=200, batch=np.array([4, 12]), decode_steps=1)
    row = next(r for r in prefill_rows(spec, pts) if r.kind == "lm.mlp.experts")
    return Call(row.kind, row.cost, row.ctx[0], routing=r)


def test_segments_only_where_the_routing_recorded_loads():
    assert expert_segments(experts_call(None)) is None
    assert expert_segments(experts_call(FixedRouting(12.0))) is None
    assert expert_segments(experts_call(routing(None))) is None
    host, device = expert_segments(experts_call(routing(SKEWED)))
    assert host.shape == device.shape == (2, E)
    np.testing.assert_allclose(host.sum(-1), 1.0)
    np.testing.assert_allclose(device.sum(-1), 1.0)
    np.testing.assert_allclose(host[:, :16], 1 / 16)  # every touched expert issues the same ops
    assert (host[:, 16:] == 0).all() and (device[:, 16:] == 0).all()
    np.testing.assert_allclose(device[0, :3], [0.4, 0.2, 0.1])  # the device time follows the rows


def prefill(r) -> list[float]:
    prof = load_profile(PROFILE)
    hw = with_profile(profile_hardware(prof), prof, "reference", routing=r)
    ws = [Workload(mode="base", text_tokens=200, batch=b, decode_steps=1) for b in (4, 12)]
    return [p["prefill"] for p in predicted_stages(ModelSpec(), ws, hw)]


def test_equal_loads_price_the_loop_as_one_segment():
    assert prefill(routing(EVEN)) == pytest.approx(prefill(routing(None)), rel=1e-12)


def test_uneven_loads_add_the_host_time_the_light_experts_leave_uncovered():
    even, skewed = prefill(routing(None)), prefill(routing(SKEWED))
    assert all(s > e for s, e in zip(skewed, even))


def test_the_loop_costs_the_sum_over_experts_of_the_larger_of_host_and_device():
    prof = load_profile(PROFILE)
    call = lambda r: predictor_for(with_profile(profile_hardware(prof), prof, "reference", routing=r))._call(  # noqa
        "lm.mlp.experts", experts_call(r).cost, experts_call(r).ctx, "")
    roof, excess, launch, host = call(routing(None))
    *same, segmented = call(routing(SKEWED))
    np.testing.assert_allclose(same, [roof, excess, launch])
    share_h, share_d = expert_segments(experts_call(routing(SKEWED)))
    device = np.asarray(roof + excess + launch)
    by_expert = np.maximum(host[:, None] * share_h, device[:, None] * share_d).sum(-1)
    np.testing.assert_allclose(segmented, by_expert)  # the row keeps segmented - device as its host excess
    assert (by_expert > np.maximum(host, device)).all()


def test_a_profile_without_a_measured_view_prices_one_at_a_share_of_an_op_and_says_so():
    """A view launches nothing: priced at the op mixes' mean, as a launching op, the reference engine's views cost
    seven times what an H200's host measured. A profile that never measured one takes VIEW_SHARE of the mean."""
    import json

    from dsocr_core.calibration.profile import VIEW_SHARE, profile_from_dict

    raw = json.loads(PROFILE.read_text())
    measured = profile_from_dict(raw)
    assert measured.view_share_assumed is None
    assert measured.host_costs["view"] == raw["launch"]["host_op_s_by_kind"]["view"]
    del raw["launch"]["host_op_s_by_kind"]
    older = profile_from_dict(raw)
    mean = raw["launch"]["host_op_s"]
    assert older.view_share_assumed == VIEW_SHARE
    assert older.host_costs == pytest.approx(dict(gemm=mean, attention=mean, other=mean, view=VIEW_SHARE * mean))
    notes = lambda p, engine: predictor_for(with_profile(profile_hardware(p), p, engine)).prediction.notes  # noqa
    assert any("no host cost of a view" in n for n in notes(older, "reference"))
    assert not any("no host cost of a view" in n for n in notes(measured, "reference"))
    assert not any("no host cost of a view" in n for n in notes(older, "fast"))


def test_points_outside_the_recorded_token_counts_keep_one_segment_in_the_same_sweep():
    """A sweep mixing points inside the recorded loads' token range (about 1,900 tokens) and outside it (about
    38,000): only the inside point is split by experts, the outside one is priced as before; a single point's scalar
    shapes give one row of shares."""
    prof = load_profile(PROFILE)
    ws = [Workload(mode="base", text_tokens=200, batch=b, decode_steps=1) for b in (4, 80)]
    plain, split = (
        [p["prefill"] for p in predicted_stages(ModelSpec(), ws, with_profile(profile_hardware(prof), prof,
                                                                              "reference", routing=r))]
        for r in (routing(None), routing(SKEWED)))
    assert split[0] > plain[0] and split[1] == pytest.approx(plain[1], rel=1e-12)
    spec = ModelSpec()
    pts = Points.build(mode="base", text_tokens=200, batch=4, decode_steps=1)
    row = next(r for r in prefill_rows(spec, pts) if r.kind == "lm.mlp.experts")
    ctx = {k: (np.asarray(v).reshape(-1)[0] if isinstance(v, np.ndarray) else v) for k, v in row.ctx[0].items()}
    host, device = expert_segments(Call(row.kind, row.cost, ctx, routing=routing(SKEWED)))
    assert host.shape == device.shape == (E,)
