"""The projector's Linear on its own table (`linear.<dtype>`, docs/accuracy.md "The projector's GEMM at its own
shape"): the plans of both engines time it there, profiles without the table fall back to the GEMM table and say
so, the calibration runs the layer as the model does (with its bias) over the rows pages give."""
from __future__ import annotations

import numpy as np
import pytest

from dsocr_core.analytic import Points, evaluate
from dsocr_core.analytic.kernels import Call, Kernel, common_vision
from dsocr_core.analytic.predict import with_profile
from dsocr_core.analytic.stages import vision_rows
from dsocr_core.analytic.vision import sam_out_side
from dsocr_core.calibration.microbench import projector_linear_grid, run_microbench
from dsocr_core.calibration.ops import kernel_op
from dsocr_core.calibration.profile import profile_from_dict, uniform_profile
from dsocr_core.engines import EngineSpec
from dsocr_core.hardware import get_hardware
from dsocr_core.registry import FAMILIES
from dsocr_core.spec import ModelSpec

H100 = get_hardware("h100-sxm")


def _projector_call(mode="gundam", batch=3, spec=None):
    spec = spec or ModelSpec()
    pts = Points.build(mode=mode, text_tokens=10, batch=batch, decode_steps=0, logits="last", crops=(3, 2))
    rows = [r for r in vision_rows(spec, pts) if r.kind == "projector"]
    return [Call(r.kind, part, ctx) for r in rows for part, ctx in zip(r.parts, r.ctx)]


def test_the_projector_plan_times_its_linear_on_the_linear_table_at_the_calls_rows():
    spec = ModelSpec()
    calls = _projector_call()
    assert len(calls) == 2  # the batch's globals in one call, its tiles in another
    rows = []
    for c in calls:
        (linear,) = [k for k in common_vision(c).kernels if k.table == "linear"]
        assert linear.coords["n"] == spec.hidden_size and linear.coords["k"] == spec.projector_input_dim
        rows.append(float(np.ravel(linear.coords["m"])[0]))
    # 3 globals of 1024 px (16 x 16 features each) and 3 x 6 tiles of 640 px (10 x 10)
    assert sorted(rows) == [3 * 256, 18 * 100]


def _profile(linear_eff: float | None):
    d = uniform_profile(H100.peak_flops, H100.bandwidth, 0.5, 0.0, kind="cuda").to_dict()
    if linear_eff is not None:
        d["tables"]["linear.bfloat16"] = dict(d["tables"]["gemm.bfloat16"], efficiency=(
            np.asarray(d["tables"]["gemm.bfloat16"]["efficiency"]) * 0 + linear_eff).tolist())
    return profile_from_dict(d)


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_the_linear_table_prices_the_projector_and_profiles_without_it_fall_back_to_the_gemm_table(engine):
    pts = Points.build(mode="gundam", text_tokens=10, batch=6, decode_steps=0, logits="last", crops=(3, 3))
    times = {}
    for eff in (None, 0.5, 0.01):
        hw = with_profile(H100, _profile(eff), EngineSpec.of(engine))
        out = evaluate(ModelSpec(), pts, hw)
        times[eff] = (float(out["projector"]["predicted_s"][0]), float(out["clip"]["predicted_s"][0]))
        fell_back = any("linear (bfloat16) timed with table gemm.bfloat16" in n for n in hw.prediction.notes)
        assert fell_back == (eff is None)
    assert times[None] == pytest.approx(times[0.5], rel=1e-9)  # the same efficiency: the same time
    assert times[0.01][0] > 2 * times[0.5][0]  # the projector's GEMM at 1% instead of 50%
    assert times[0.01][1] == times[0.5][1]  # CLIP's GEMMs stay on the GEMM table


def test_the_linear_calibration_runs_a_linear_layer_with_its_bias():
    make, op, nbytes, kernels = kernel_op("linear.bfloat16", {"m": 300, "n": 1280, "k": 2048}, "cpu", 64)
    x, w, b = make()
    assert tuple(x.shape) == (300, 2048) and tuple(w.shape) == (1280, 2048) and tuple(b.shape) == (1280,)
    out = op((x, w, b))
    assert tuple(out.shape) == (300, 1280) and kernels == 1
    assert nbytes == (300 * 2048 + 1280 * 2048 + 1280) * 2
    assert float((out - (x.float() @ w.float().T + b.float())).abs().max()) < 0.5  # the bias is added


def test_the_linear_grid_holds_every_familys_projector_at_the_rows_its_pages_give():
    grid = projector_linear_grid()
    m = np.asarray(grid["m"])
    assert np.all(np.diff(m) > 0) and m[-1] == 65536
    for family in FAMILIES.values():
        spec = family.preset("full")
        assert spec.hidden_size in grid["n"] and spec.projector_input_dim in grid["k"]
        for mode in family.modes.values():
            for side in (mode.base_size, mode.tile_size):
                f = sam_out_side(spec, side) ** 2
                # every view count whose rows stay in the dense part: 9 tiles of 100 rows, 7 globals of 256, ...
                assert set(range(f, 4097, f)) <= set(m.astype(int))
    assert len(m[m > 4096]) == 8  # then 2^(1/2) steps


def test_a_quick_calibration_adds_the_linear_table_to_a_profile():
    base = run_microbench("cpu", quick=True, budget_s=30, tables=["gemm.bfloat16", "memory.copy"])
    added = run_microbench("cpu", quick=True, budget_s=30, tables=["linear.bfloat16"], add_to=base)
    table = added.table("linear.bfloat16")
    assert table is not None and table.axes == ("m", "n", "k") and bool(np.all(table.measured))
    assert np.all(table.efficiency > 0)


def test_passes_measure_every_entry_again_in_reverse_order_and_keep_the_lowest_time(monkeypatch):
    """calibrate --passes 2: the second pass runs the entries backwards; one slow measurement (a glitch of the
    first pass) does not stay in the table, and the notes name the entry whose passes differ."""
    import dsocr_core.calibration.microbench as mb

    calls = []

    def fake(name, coords, st):  # 1 ms of work an entry (launch gaps are microseconds), but the first
        calls.append((name, coords["m"]))  # measurement of m = 64 in a run took 4 ms
        slow = coords["m"] == 64 and calls.count((name, 64)) == 1
        return 4e-3 if slow else 1e-3

    monkeypatch.setattr(mb, "measure_entry", fake)
    real_launch = mb.launch_costs  # a fixed launch gap: this CPU's own (up to a millisecond when it is busy)
    monkeypatch.setattr(mb, "launch_costs", lambda st, host_stages=False: {
        **real_launch(st, False), "eager_kernel_s": 1e-6, "graph_kernel_s": 1e-6})
    base = run_microbench("cpu", quick=True, budget_s=30, tables=["gemm.bfloat16"])
    calls.clear()
    two = run_microbench("cpu", quick=True, budget_s=30, tables=["linear.bfloat16"], add_to=base, passes=2)
    assert calls == [("linear.bfloat16", 16), ("linear.bfloat16", 64), ("linear.bfloat16", 64),
                     ("linear.bfloat16", 16)]
    table = two.table("linear.bfloat16")
    assert table.meta["passes"] == table.meta["passes_completed"] == 2 and table.meta["pass_spread_max"] == 3.0
    assert "linear.bfloat16: 1 of its entries differed by more than 20% between passes (the lowest time kept): " \
           "m=64, n=16, k=48 (+300%)" in two.raw["calibration"]["notes"]
    calls.clear()
    one = run_microbench("cpu", quick=True, budget_s=30, tables=["linear.bfloat16"], add_to=base)
    glitched = one.table("linear.bfloat16")  # one pass: the first measurement of m = 64 (the slow one) stays
    assert "passes" not in glitched.meta
    ratio = lambda t: t.efficiency.ravel()[1] / t.efficiency.ravel()[0]  # noqa: E731 - m = 64 against m = 16
    assert ratio(glitched) < ratio(table) / 3  # the passes kept m = 64 at the time m = 16 took, as the work was
    with pytest.raises(ValueError, match="passes must be at least 1"):
        run_microbench("cpu", quick=True, budget_s=30, tables=["linear.bfloat16"], add_to=base, passes=0)


def test_calibrate_refuses_fewer_than_one_pass_in_one_line(capsys):
    from dsocr_core.cli import main

    assert main(["calibrate", "--device", "cpu", "--quick", "--passes", "0", "--out", "unused.json"]) == 2
    err = capsys.readouterr().err
    assert "--passes must be at least 1, got 0" in err and "Traceback" not in err


def test_a_pass_cut_short_keeps_the_earlier_times_and_says_so(monkeypatch):
    """A stop (or the budget) in the second pass: every entry keeps its first pass's time, the table says how many
    passes measured all of it, the notes say where the pass ended, and the calibration counts as complete (every
    entry was measured); an error in a later pass is no failure of an entry the first pass measured."""
    import dsocr_core.calibration.microbench as mb

    calls = []

    def fake(name, coords, st):
        calls.append(coords["m"])
        if len(calls) == 3:  # the second pass's first entry (m = 64): fails
            raise RuntimeError("out of memory")
        return 1e-3

    monkeypatch.setattr(mb, "measure_entry", fake)
    base = run_microbench("cpu", quick=True, budget_s=30, tables=["gemm.bfloat16"])
    calls.clear()
    stop = lambda: len(calls) >= 3  # noqa: E731 - nothing after the failed call
    prof = run_microbench("cpu", quick=True, budget_s=30, tables=["linear.bfloat16"], add_to=base, passes=2,
                          should_stop=stop)
    assert calls == [16, 64, 64]
    table = prof.table("linear.bfloat16")
    assert bool(np.all(table.measured)) and table.meta["passes"] == 2 and table.meta["passes_completed"] == 1
    assert "pass_spread_max" not in table.meta  # no entry measured twice
    notes = prof.raw["calibration"]["notes"]
    assert any(n.startswith("pass 2 of 2 ended early") and "after 1 of 2 entries" in n for n in notes), notes
    assert prof.raw["calibration"]["notes"].count("linear.bfloat16: nothing measured") == 0

    def second_pass_fails(name, coords, st):
        calls.append(coords["m"])
        if len(calls) > 12:  # the quick GEMM grid has 12 entries: every one fails in the second pass
            raise RuntimeError("out of memory")
        return 1e-3

    calls.clear()
    monkeypatch.setattr(mb, "measure_entry", second_pass_fails)
    alone = run_microbench("cpu", quick=True, budget_s=30, tables=["gemm.bfloat16"], passes=2)
    cal = alone.raw["calibration"]
    assert len(calls) == 24 and cal["complete"] and cal["failed"] == {} and cal["skipped"]["error"] == 0
    assert alone.table("gemm.bfloat16").meta["passes_completed"] == 1


def test_other_dtypes_take_the_gemm_table_of_their_dtype_before_a_bf16_linear_table():
    """A float32 run: linear.float32, else gemm.float32 (the GEMM in the run's dtype), and only then the bf16
    tables; the same order for the conv."""
    from dsocr_core.analytic.predict import _candidates, predictor_for

    assert [n for n, _ in _candidates("linear", "float32")] == ["linear.float32", "gemm.float32", "linear.bfloat16",
                                                               "gemm.bfloat16"]
    assert [n for n, _ in _candidates("conv", "float32")] == ["conv.float32", "gemm.float32", "conv.bfloat16",
                                                             "gemm.bfloat16"]
    d = _profile(0.01).to_dict()  # a bf16 linear table at 1%; the float32 GEMM table as the uniform profile has it
    d["tables"]["gemm.float32"] = dict(d["tables"]["gemm.bfloat16"])
    pr = predictor_for(with_profile(H100, profile_from_dict(d), EngineSpec.of("fast")))
    k = Kernel("linear", dict(m=800, n=1280, k=2048), 2 * 800 * 1280 * 2048, 0.0, 1.0)
    assert pr.table_name("linear", "float32") == "gemm.float32" and pr.table_name("linear", "bfloat16") == \
        "linear.bfloat16"
    assert pr.kernel_s(k, "float32") < pr.kernel_s(k, "bfloat16") / 10  # 50% against 1%
