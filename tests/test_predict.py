"""The time model (issue 14): prediction equals the roofline with efficiency 1 and no launch cost, hand-computed
predictions of one row, kernel plans that partition each row's work, launch counts of the fused decode step,
vectorised sweeps equal to single points, decode steps summed by Simpson's rule, and `analytic --profile`."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from dsocr_core.analytic import Points, analyze, evaluate, module_table, sweep_columns
from dsocr_core.analytic.kernels import Call, Kernel
from dsocr_core.analytic.predict import PREDICTED, Prediction, Predictor, with_profile
from dsocr_core.analytic.stages import aggregate, all_rows, decode_step_rows, prefill_rows
from dsocr_core.calibration.profile import build_profile, profile_from_dict, uniform_profile
from dsocr_core.cli import main
from dsocr_core.engines import EngineSpec
from dsocr_core.hardware import get_hardware
from dsocr_core.spec import ModelSpec, Workload, tiny_spec

H200 = get_hardware("h200")
STAGES = ("sam", "clip", "projector", "vision", "prefill", "decode", "total")


def _profile(eff: float = 1.0, kind: str = "cuda", **launch) -> object:
    """A uniform profile on the H200's ceilings; launch costs by key (default 0)."""
    d = uniform_profile(H200.peak_flops, H200.bandwidth, eff, 0.0, kind=kind).to_dict()
    d["launch"].update(launch)
    return profile_from_dict(d)


def _grid(**kw) -> Points:
    return Points.grid(crops=[(1, 1), (2, 2), (3, 2)], text_tokens=[10, 700], batch=[1, 3],
                       decode_steps=[0, 1, 17], **kw)


# ------------------------------------------------------------------------------------------ the roofline
@pytest.mark.parametrize("mode", ["reference", "fast"])
@pytest.mark.parametrize("kind", ["cuda", "cpu"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_efficiency_one_and_no_launch_cost_is_the_roofline(mode, kind, attn):
    spec = ModelSpec()
    pts = _grid(attn=attn)
    hw = with_profile(H200, _profile(kind=kind), mode, work="analytic")
    st = evaluate(spec, pts, hw)
    for s in STAGES:
        np.testing.assert_allclose(st[s]["predicted_s"], st[s]["time_s"], rtol=1e-12, atol=0)
        np.testing.assert_allclose(st[s]["predicted_roofline_s"], st[s]["time_s"], rtol=1e-12, atol=0)
        for part in ("predicted_kernel_s", "predicted_launch_s", "predicted_host_s"):
            np.testing.assert_allclose(st[s][part], 0.0, atol=1e-18)
    table = module_table(spec, Workload(crops=(2, 2), decode_steps=9, attn=attn), hw)
    np.testing.assert_allclose(table["predicted_s"], table["time_s"], rtol=1e-12)
    cap = analyze(spec, Workload(crops=(3, 2), decode_steps=50, batch=4), hw)["capacity"]
    assert cap["predicted_ttft_s"] == pytest.approx(cap["ttft_s"], rel=1e-12)
    assert cap["predicted_tpot_s"] == pytest.approx(cap["tpot_s"], rel=1e-12)
    assert cap["predicted_pages_per_day"] == pytest.approx(cap["pages_per_day"], rel=1e-12)


def test_engine_work_adds_the_reference_cache_concatenation_and_sams_bias_copy():
    """With efficiency 1 and no launch cost, work='engine' differs from the analytic work by exactly the work the
    analytic model does not count: SAM's dense relative-position bias copied once more (reshaped from the
    broadcast sum's strides: every score read and written), SAM's channels-first stream copied to rows before each
    LayerNorm, and the reference cache's torch.cat, which rewrites every layer's cache. Both with each kernel's own
    roofline (the reference plan gives no row an overlap credit), so only the work differs."""
    spec = tiny_spec()
    w = Workload(mode="base", text_tokens=30, batch=2, decode_steps=7)
    pts = Points.from_workload(w)
    st = evaluate(spec, pts, with_profile(H200, _profile(), "reference", work="engine"))
    counted = evaluate(spec, pts, with_profile(H200, _profile(), "reference", work="analytic", overlap="kernel"))
    for s in ("clip", "projector"):
        assert st[s]["predicted_s"][0] == pytest.approx(counted[s]["predicted_s"][0], rel=1e-12)
    p, win, heads, views = 64, spec.sam_window, spec.sam_heads, 2  # base: one 1024 px view per page, batch 2
    n_global = len(spec.sam_global_blocks)
    scores = n_global * heads * (p * p) ** 2 + (spec.sam_layers - n_global) * (-(-p // win)) ** 2 * heads * win ** 4
    copy = 2 * views * scores * 2 / H200.bandwidth  # read and write, bf16
    norm_copies = 2 * spec.sam_layers * 2 * views * p * p * spec.sam_width * 2 / H200.bandwidth
    assert st["sam"]["predicted_s"][0] == pytest.approx(counted["sam"]["predicted_s"][0] + copy + norm_copies,
                                                        rel=1e-9)
    seq, b, h, dt = float(pts.sequence[0]), 2, spec.hidden_size, 2
    extra = 0.0
    for i in range(7):  # step i: cat reads the old cache and the new entry and writes all, instead of the entry
        sk = seq + i + 1
        extra += (2 * b * sk * 2 * h * dt - b * 2 * h * dt) / H200.bandwidth
    extra *= spec.num_hidden_layers
    assert st["decode"]["predicted_kernel_s"][0] == pytest.approx(extra, rel=1e-9)
    assert st["decode"]["predicted_s"][0] == pytest.approx(counted["decode"]["predicted_s"][0] + extra, rel=1e-9)
    # prefill appends to an empty cache: nothing is copied, so the engine does less than the count
    assert st["prefill"]["predicted_s"][0] < counted["prefill"]["predicted_s"][0]


def test_kernel_overlap_sums_each_kernels_own_roofline():
    """overlap='kernel': with efficiency 1 the prediction is the sum of the kernels' own rooflines, never below
    the row's roofline, and equal to it where every kernel of a call has the same bound (batch-1 decode)."""
    spec = ModelSpec()
    pts = Points.grid(crops=[(2, 2)], batch=[1], decode_steps=[5])
    row_ov = evaluate(spec, pts, with_profile(H200, _profile(), "reference", "analytic", "row"))
    ker_ov = evaluate(spec, pts, with_profile(H200, _profile(), "reference", "analytic", "kernel"))
    for s in STAGES:
        assert np.all(ker_ov[s]["predicted_s"] >= row_ov[s]["predicted_s"] * (1 - 1e-12))
    assert ker_ov["sam"]["predicted_s"][0] > 1.1 * row_ov["sam"]["predicted_s"][0]  # GEMMs + mask traffic
    assert ker_ov["decode"]["predicted_s"][0] == pytest.approx(row_ov["decode"]["predicted_s"][0], rel=1e-6)


# ------------------------------------------------------------------------------------------ by hand
def _lm_head_row(spec):
    pts = Points.from_workload(Workload(mode="base", text_tokens=20, logits="last"))
    (row,) = [r for r in prefill_rows(spec, pts) if r.kind == "lm.lm_head"]
    return row


def _custom(eff_gemm, eff_mem, **launch):
    d = _profile().to_dict()
    d["tables"]["gemm.bfloat16"]["efficiency"] = [[[eff_gemm]]]
    for table in ("memory.elementwise", "memory.cast"):  # the cast: the lm_head's .float() of its logits
        d["tables"][table]["efficiency"] = [eff_mem]
    d["launch"].update(launch)
    return profile_from_dict(d)


def test_one_row_by_hand():
    """lm_head of a reference prefill (last-position logits): a GEMM and the .float() copy."""
    spec = tiny_spec()
    row = _lm_head_row(spec)
    h, v, dt = spec.hidden_size, spec.vocab_size, 2
    P, W = H200.peak_flops, H200.bandwidth
    f_total, b_total = float(row.cost.flops[0]), float(row.cost.bytes[0])
    f_g, b_g = 2 * h * v, (h + v * h + v) * dt  # the GEMM's share
    b_r = b_total - b_g  # the rest: reading dt logits, writing fp32 logits
    assert f_total == f_g and b_r == pytest.approx(v * dt + v * 4)
    r_g, r_r = max(f_g / P, b_g / W), b_r / W
    roof = max(f_total / P, b_total / W)
    pred = Predictor(Prediction(_custom(0.5, 0.25, eager_kernel_s=2e-6, host_op_s=1e-6), EngineSpec.of("reference")))
    out = {k: float(np.asarray(v).reshape(-1)[0]) for k, v in pred.row(row).items()}
    kernel = r_g / 0.5 - r_g + r_r / 0.25 - r_r
    assert out["predicted_roofline_s"] == pytest.approx(roof, rel=1e-12)
    assert out["predicted_kernel_s"] == pytest.approx(kernel, rel=1e-12)
    assert out["predicted_launch_s"] == pytest.approx(2 * 2e-6, rel=1e-12)  # two eager kernels
    assert out["predicted_host_s"] == 0.0  # 2 host ops x 1 us do not outrun the device
    assert out["predicted_s"] == pytest.approx(roof + kernel + 4e-6, rel=1e-12)
    # host-bound: the device waits for the host, so the time is the host's
    slow = Predictor(Prediction(_custom(0.5, 0.25, eager_kernel_s=2e-6, host_op_s=1.0), EngineSpec.of("reference")))
    out = {k: float(np.asarray(v).reshape(-1)[0]) for k, v in slow.row(row).items()}
    assert out["predicted_s"] == pytest.approx(2.0, rel=1e-12)
    assert out["predicted_host_s"] == pytest.approx(2.0 - (roof + kernel + 4e-6), rel=1e-9)


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_the_lm_heads_cast_to_float32_is_a_kernel_of_its_own_timed_on_the_cast_table(engine):
    """Both engines run the lm_head's GEMM, then .float() of its logits: a second kernel (two bytes read, four
    written per logit) after the GEMM, priced on memory.cast and added to the GEMM's time, not hidden under its
    compute; a profile without the table prices it on memory.elementwise and says so."""
    spec = ModelSpec()
    pts = Points.from_workload(Workload(mode="large", text_tokens=256, batch=54, logits="all"))
    (row,) = [r for r in prefill_rows(spec, pts) if r.kind == "lm.lm_head"]
    rows = 54 * (256 + 421)  # every prompt position's logits
    cells = rows * spec.vocab_size

    def predicted(cast_eff, drop_cast=False):
        d = _profile(kind="cuda").to_dict()
        d["tables"]["memory.cast"]["efficiency"] = [cast_eff]
        if drop_cast:
            del d["tables"]["memory.cast"]
        pred = Predictor(Prediction(profile_from_dict(d), EngineSpec.of(engine)))
        plan = pred.plan.plan(Call(row.kind, row.cost, row.ctx[0], "", None))
        return float(np.asarray(pred.row(row)["predicted_s"]).reshape(-1)[0]), plan, pred.prediction.notes

    at_one, plan, notes = predicted(1.0)
    assert [k.table for k in plan.kernels] == ["gemm", "memory.cast"] and not any("memory.cast" in n for n in notes)
    assert np.asarray(plan.kernels[1].nbytes).item() == cells * 6 and np.asarray(plan.rest_launches).item() == 0.0
    gemm_s = max(2 * rows * spec.hidden_size * spec.vocab_size / H200.peak_flops,
                 (rows * spec.hidden_size + spec.vocab_size * spec.hidden_size + cells) * 2 / H200.bandwidth)
    # at efficiency 1 the kernels' own times add up: the GEMM's compute, then the cast's traffic
    assert at_one == pytest.approx(gemm_s + cells * 6 / H200.bandwidth, rel=1e-9)
    assert predicted(0.5)[0] == pytest.approx(at_one + cells * 6 / H200.bandwidth, rel=1e-9)
    fallback, _, notes = predicted(0.5, drop_cast=True)
    assert fallback == pytest.approx(at_one, rel=1e-9)  # the uniform profile's elementwise table, efficiency 1
    assert "memory.cast (bfloat16) timed with table memory.elementwise: the profile has no memory.cast" in notes


@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_float32_logits_need_no_cast_and_leave_no_remainder(engine):
    """.float() of float32 logits is the tensor itself: no kernel planned and no bytes counted for it."""
    spec = ModelSpec()
    pts = Points.from_workload(Workload(mode="base", text_tokens=30, batch=2, logits="all", dtype="float32"))
    (row,) = [r for r in prefill_rows(spec, pts) if r.kind == "lm.lm_head"]
    pred = Predictor(Prediction(_profile(kind="cuda"), EngineSpec.of(engine)))
    plan = pred.plan.plan(Call(row.kind, row.cost, row.ctx[0], "", None))
    assert [k.table for k in plan.kernels] == ["gemm"] and np.asarray(plan.rest_launches).item() == 0.0
    assert np.asarray(row.cost.bytes).item() == pytest.approx(np.asarray(plan.kernels[0].nbytes).item())


def test_the_fused_steps_lm_head_is_timed_on_its_own_kernels_table():
    """The fused batch-1 step's lm_head kernel (norm, logits, each block's best token, then the greedy choice) is
    priced on memory.fused_lm_head, the table of that kernel; a profile made before it prices the kernel on
    memory.fused_gemv (the step's other weight kernels) and says so."""
    spec = ModelSpec()
    pts = Points.from_workload(Workload(mode="base", batch=1))
    (row,) = [r for r in decode_step_rows(spec, pts, np.array(300.0)) if r.kind == "lm.lm_head"]

    def predicted(head_eff, drop=False):
        d = _profile(kind="cuda").to_dict()
        d["tables"]["memory.fused_lm_head"]["efficiency"] = [head_eff]
        if drop:
            del d["tables"]["memory.fused_lm_head"]
        pred = Predictor(Prediction(profile_from_dict(d), EngineSpec.of("fast")))
        plan = pred.plan.plan(Call(row.kind, row.cost, row.ctx[0], "fused", None))
        return float(np.asarray(pred.row(row)["predicted_s"]).reshape(-1)[0]), plan, pred.prediction.notes

    at_one, plan, notes = predicted(1.0)
    (head,) = plan.kernels
    assert head.table == "memory.fused_lm_head" and head.launches == 2.0  # the lm_head, then the choice
    weights = spec.vocab_size * spec.hidden_size * 2
    assert weights < np.asarray(head.nbytes).item() < weights * 1.01
    assert predicted(0.5)[0] == pytest.approx(2 * at_one, rel=1e-6)  # all of the row is that kernel's traffic
    fallback, _, notes = predicted(0.5, drop=True)
    assert fallback == pytest.approx(at_one, rel=1e-9)  # the uniform profile's fused_gemv table, efficiency 1
    assert ("memory.fused_lm_head (bfloat16) timed with table memory.fused_gemv: the profile has no "
            "memory.fused_lm_head") in notes


def test_eager_ops_are_priced_at_their_kinds_host_cost():
    """A profile measuring the host cost per kind of eager op (GEMM, attention, other launching ops, views) prices
    each op at its kind's cost; a kind it did not measure costs the mix's mean (host_op_s), so a profile made
    before the kinds were measured predicts as before."""
    from dsocr_core.analytic.kernels import host_ops_by_kind

    spec = ModelSpec()
    w = Workload(crops=(2, 1), text_tokens=100, batch=2, decode_steps=3)
    rows = [r for r in all_rows(spec, Points.from_workload(w)) if r.stage in ("prefill", "decode")]
    mean = dict(eager_kernel_s=0.0, host_op_s=1e-3)  # host-bound: the host term is the prediction
    old = Predictor(Prediction(_profile(**mean), EngineSpec.of("reference")))
    same = Predictor(Prediction(_profile(**mean, host_op_s_by_kind={k: 1e-3 for k in ("gemm", "attention")}),
                                EngineSpec.of("reference")))
    for row in rows:
        assert np.allclose(same.row(row)["predicted_s"], old.row(row)["predicted_s"], rtol=1e-12), row.kind

    costs = {"gemm": 2e-3, "attention": 3e-3, "other": 5e-4, "view": 1e-4}
    kinds = Predictor(Prediction(_profile(**mean, host_op_s_by_kind=costs), EngineSpec.of("reference")))
    (experts,) = [r for r in rows if r.kind == "lm.mlp.experts" and r.stage == "prefill"]
    plan = kinds.plan.plan(Call(experts.kind, experts.cost, experts.ctx[0]))
    ops = host_ops_by_kind(plan, graphs=False)
    assert float(np.sum(ops["view"])) > 0 and float(np.sum(ops["gemm"])) > 0  # the expert loop's slices, GEMMs
    want = sum(np.asarray(n) * costs[k] for k, n in ops.items())  # no sync cost in this profile
    assert np.allclose(kinds.row(experts)["predicted_s"], want, rtol=1e-9)  # host-bound: one module's host time


def test_eager_attention_is_host_priced_as_its_matmuls_and_ops_not_as_one_sdpa():
    from dsocr_core.analytic.kernels import host_ops_by_kind

    spec = ModelSpec()
    for attn, want_gemm, want_attention in (("eager", 4 + 2, 0), ("sdpa", 4, 1)):
        pts = Points.from_workload(Workload(mode="base", text_tokens=20, attn=attn))
        (row,) = [r for r in prefill_rows(spec, pts) if r.kind == "lm.self_attn"]
        plan = EngineSpec.of("reference").kernel_plan("cuda").plan(Call(row.kind, row.cost, row.ctx[0]))
        ops = {k: float(np.sum(v)) for k, v in host_ops_by_kind(plan, graphs=False).items()}
        launches = sum(float(np.sum(k.launches)) for k in plan.kernels) + float(np.sum(plan.rest_launches))
        assert (ops["gemm"], ops["attention"]) == (want_gemm, want_attention), attn  # q/k/v/o projections + ...
        assert sum(ops.values()) == launches  # every launch priced once


def test_a_profile_saved_without_host_costs_per_kind_stays_readable_by_older_versions(tmp_path):
    saved = json.loads(_profile().save(tmp_path / "p.json").read_text())
    assert "host_op_s_by_kind" not in saved["launch"]
    kinds = _profile(host_op_s_by_kind={"view": 1e-6}).save(tmp_path / "k.json")
    assert json.loads(kinds.read_text())["launch"]["host_op_s_by_kind"] == {"view": 1e-6}


def test_host_costs_per_kind_are_validated_and_kept_by_a_derived_profile():
    from dsocr_core.calibration.derive import derive_profile
    from dsocr_core.calibration.profile import ProfileError

    good = _profile(host_op_s=2e-5, host_op_s_by_kind={"gemm": 1e-5, "view": 2e-6})
    assert good.host_costs == {"gemm": 1e-5, "attention": 2e-5, "other": 2e-5, "view": 2e-6}
    assert derive_profile(good, "h100-sxm", source_hardware="h200").host_costs == good.host_costs
    for bad, words in (({"gemm": -1.0}, "launch.host_op_s_by_kind.gemm must be a non-negative number"),
                       ({"view": float("nan")}, "launch.host_op_s_by_kind.view must be a non-negative number"),
                       ({"gemm": 5.0}, "launch.host_op_s_by_kind.gemm is 5 s"),
                       ({"python": 1e-6}, "host_op_s_by_kind.python")):
        d = _profile().to_dict()
        d["launch"]["host_op_s_by_kind"] = bad
        with pytest.raises(ProfileError, match=words.replace(".", r"\.")):
            profile_from_dict(d)


def test_fused_decode_step_launches_5_per_dense_6_per_moe_layer():
    spec = ModelSpec()
    prof = _profile(graph_kernel_s=1.0)  # one second per launch: predicted launch time counts the kernels
    hw = with_profile(H200, prof, "fast", work="analytic")
    table = module_table(spec, Workload(crops=(2, 2), decode_steps=1), hw)
    dec = table[table.stage == "decode"]
    per_layer = dec.assign(layer=dec.module.str.extract(r"layers\.(\d+)\.")[0]).groupby("layer")[
        "predicted_launch_s"].sum()
    assert per_layer["0"] == 5 and all(per_layer[str(i)] == 6 for i in range(1, 12))
    assert dec.predicted_launch_s.sum() == 73  # 72 with the lm_head, + the greedy choice
    # batch 2 is not fused: more kernels per layer
    st = evaluate(spec, Points.grid(crops=[(2, 2)], batch=[1, 2], decode_steps=[1]), hw)
    assert st["decode"]["predicted_launch_s"][0] == 73 and st["decode"]["predicted_launch_s"][1] > 73 * 2


def test_reference_decode_syncs_once_per_moe_layer():
    spec = ModelSpec()
    hw = with_profile(H200, _profile(sync_s=1.0), "reference", work="analytic")
    st = evaluate(spec, Points.grid(crops=[(2, 2)], decode_steps=[3]), hw)
    moe = len(spec.moe_layers)
    assert st["decode"]["predicted_s"][0] == pytest.approx(3 * moe, rel=1e-3)  # host-bound: 11 syncs per step


# ------------------------------------------------------------------------------------------ plans
@pytest.mark.parametrize("mode", ["reference", "fast"])
def test_kernel_shares_never_exceed_the_row(mode):
    spec = ModelSpec()
    for attn in ("sdpa", "eager"):
        pts = Points.grid(crops=[(1, 1), (2, 3)], text_tokens=[10, 900], batch=[1, 5], decode_steps=[4], attn=attn)
        rows = all_rows(spec, pts) + decode_step_rows(spec, pts, pts.sequence + 3.0)
        for row in rows:
            parts = [(row.steps[0], row.ctx[0]), (row.steps[1], row.ctx[1])] if row.steps else \
                list(zip(row.parts or (row.cost,), row.ctx))
            for cost, ctx in parts:
                for path in (("", "fused", "triton") if mode == "fast" and ctx["phase"] == "decode" else ("",)):
                    pl = EngineSpec.of(mode).kernel_plan("cuda").plan(Call(row.kind, cost, ctx, path))
                    f = sum((k.flops for k in pl.kernels), 0.0)
                    b = sum((k.nbytes for k in pl.kernels), 0.0)
                    assert np.all(f <= cost.flops * (1 + 1e-12) + 1e-6), row.kind
                    assert np.all(b <= cost.bytes * (1 + 1e-12) + 1e-6), row.kind


# ------------------------------------------------------------------------------------------ vectorised
def _random_profile(seed: int = 0):
    """Efficiencies that vary with the shape, on small grids (so interpolation and clamping both happen)."""
    rng = np.random.default_rng(seed)
    d = _profile(kind="cuda", graph_kernel_s=2e-6, eager_kernel_s=3e-6, host_op_s=8e-6, sync_s=2e-5,
                 graph_launch_s=5e-6).to_dict()
    for name, t in d["tables"].items():
        axes = {a: [1.0, 64.0, 4096.0] for a in t["axes"]}
        if "bytes" in axes:
            axes = {"bytes": [1e3, 1e6, 1e9]}
        shape = tuple(len(v) for v in axes.values())
        t["axes"], t["efficiency"], t["measured"] = axes, rng.uniform(0.05, 1.0, shape).tolist(), None
    return profile_from_dict(d)


@pytest.mark.parametrize("mode", ["reference", "fast"])
def test_sweep_equals_single_points(mode):
    spec = tiny_spec()
    hw = with_profile(H200, _random_profile(), mode)
    pts = _grid()
    st = evaluate(spec, pts, hw)
    cols = pts.columns()
    for i in range(pts.size):
        w = Workload(mode="gundam", crops=(int(cols["crops_w"][i]), int(cols["crops_h"][i])),
                     text_tokens=int(cols["text_tokens"][i]), batch=int(cols["batch"][i]),
                     decode_steps=int(cols["decode_steps"][i]))
        one = evaluate(spec, Points.from_workload(w), hw)
        for s in STAGES:
            for k in PREDICTED:
                assert st[s][k][i] == pytest.approx(one[s][k][0], rel=1e-12, abs=1e-18), (s, k, i)


def test_decode_steps_sum_by_simpson_close_to_the_step_by_step_sum():
    spec = tiny_spec()
    hw = with_profile(H200, _random_profile(1), "fast")
    steps = 40
    pts = Points.grid(crops=[(2, 2)], text_tokens=[100], batch=[1, 2], decode_steps=[steps])
    total = evaluate(spec, pts, hw)["decode"]["predicted_s"]
    by_step = sum(aggregate(decode_step_rows(spec, pts, pts.sequence + float(i)), (pts.size,), hw)["decode"]
                  ["predicted_s"] for i in range(steps))
    np.testing.assert_allclose(total, by_step, rtol=0.01)
    one = Points.grid(crops=[(2, 2)], text_tokens=[100], batch=[1, 2], decode_steps=[1])
    exact = aggregate(decode_step_rows(spec, one, one.sequence.astype(float)), (2,), hw)["decode"]["predicted_s"]
    np.testing.assert_allclose(evaluate(spec, one, hw)["decode"]["predicted_s"], exact, rtol=1e-12)


def test_missing_table_falls_back_and_says_so():
    d = _profile().to_dict()
    for name in [n for n in d["tables"] if n.startswith(("attention.flash", "attention.default"))]:
        d["tables"].pop(name)
    prof = profile_from_dict(d)
    hw = with_profile(H200, prof, "fast")
    out = analyze(ModelSpec(), Workload(crops=(2, 2), decode_steps=4), hw)
    notes = out["prediction"]["notes"]
    # the fast engine's vision and prefill SDPA: the default-backend table, then (no flash table either) sdpa
    assert any("no attention.default.causal" in n and "attention.sdpa.causal" in n for n in notes)
    assert any(n.endswith("no attention.default") and "attention.sdpa" in n for n in notes)


def test_the_graph_start_is_charged_once_to_the_projector_and_the_lm_prefill():
    """A profile's launch.graph_start_s is device time each graphed stage's timer sees once: the fast plan charges it
    to the projector and the LM prefill (SAM's and CLIP's milliseconds are left without it), to nothing in the
    reference mode (no graphs) and to no decode step; a profile without it says so."""
    base = _profile().to_dict()
    # real launch and host costs: the graph's start must not hide under the host's submission of the graph
    base["launch"] = {**base["launch"], "graph_kernel_s": 1e-6, "graph_launch_s": 4e-6, "host_op_s": 1.5e-5,
                      "eager_kernel_s": 2e-6}
    w = Workload(crops=(2, 2), batch=3, decode_steps=4)
    stages = {}
    for cost in (None, 5e-6):
        d = json.loads(json.dumps(base))
        d["launch"].pop("graph_start_s", None)
        if cost is not None:
            d["launch"]["graph_start_s"] = cost
        for mode in ("fast", "reference"):
            out = analyze(ModelSpec(), w, with_profile(H200, profile_from_dict(d), mode))
            stages[cost, mode] = out["stages"]
            noted = any("no graph start cost" in n for n in out["prediction"]["notes"])
            assert noted == (cost is None and mode == "fast")
    for stage in ("sam", "clip", "projector", "prefill", "decode"):
        added = stages[5e-6, "fast"][stage]["predicted_s"] - stages[None, "fast"][stage]["predicted_s"]
        assert added == pytest.approx(5e-6 if stage in ("projector", "prefill") else 0.0, abs=1e-12), stage
        assert stages[5e-6, "reference"][stage]["predicted_s"] == pytest.approx(
            stages[None, "reference"][stage]["predicted_s"], rel=1e-12)


def _scaled(table: dict, factor: float) -> dict:
    return {**table, "efficiency": (np.asarray(table["efficiency"]) * factor).tolist()}


def test_default_backend_table_prices_the_fast_engines_sdpa_and_falls_back_to_the_old_tables():
    """The fast plan prices SAM's, CLIP's and the LM prefill's attention on attention.default (torch's own SDPA
    backend, what the compiled layers call); a profile without the table gives exactly the prediction of the
    tables it falls back to: sdpa for SAM and CLIP, flash (not sdpa) for the prefill."""
    base = _profile().to_dict()
    tables = {k: v for k, v in base["tables"].items() if not k.startswith("attention.default")}
    # every candidate its own efficiency, so that a wrong fallback shows
    tables["attention.sdpa"] = _scaled(tables["attention.sdpa"], 0.5)
    tables["attention.sdpa.causal"] = _scaled(tables["attention.sdpa.causal"], 0.3)
    tables["attention.flash.causal"] = _scaled(tables["attention.flash.causal"], 0.7)
    without = {**base, "tables": tables}
    w = Workload(crops=(2, 2), decode_steps=4)
    predict = lambda d: analyze(ModelSpec(), w, with_profile(H200, profile_from_dict(d), "fast"))["stages"]  # noqa
    old = predict(without)
    copies = {"flash": {"attention.default": tables["attention.sdpa"],
                        "attention.default.causal": tables["attention.flash.causal"]},
              "sdpa": {"attention.default": tables["attention.sdpa"],
                       "attention.default.causal": tables["attention.sdpa.causal"]}}
    same = predict({**without, "tables": {**tables, **copies["flash"]}})
    other = predict({**without, "tables": {**tables, **copies["sdpa"]}})
    for stage in ("sam", "clip", "prefill", "projector"):
        assert same[stage]["predicted_s"] == pytest.approx(old[stage]["predicted_s"], rel=1e-12), stage
    assert other["prefill"]["predicted_s"] > old["prefill"]["predicted_s"] * 1.001  # the fallback was flash
    # a slower default backend makes exactly SAM, CLIP and the prefill slower
    slow = {**without, "tables": {**tables, **{k: _scaled(v, 0.5) for k, v in copies["flash"].items()}}}
    slower = predict(slow)
    for stage in ("sam", "clip", "prefill"):
        assert slower[stage]["predicted_s"] > old[stage]["predicted_s"]
    assert slower["projector"]["predicted_s"] == pytest.approx(old["projector"]["predicted_s"], rel=1e-12)



# ------------------------------------------------------------------------------------------ the command
@pytest.fixture
def profile_file(tmp_path):
    return _random_profile(2).save(tmp_path / "prof.json")


def test_analytic_cli_profile_table_and_json(profile_file, capsys):
    assert main(["analytic", "--crops", "2x2", "--decode-steps", "100", "--profile", str(profile_file),
                 "--session-mode", "fast"]) == 0
    out = capsys.readouterr().out
    assert "predicted ms" in out and "predicted (fast mode" in out and "TPOT" in out
    assert main(["analytic", "--crops", "2x2", "--decode-steps", "10", "--profile", str(profile_file),
                 "--json", "--per-module"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["prediction"]["session_mode"] == "reference" and res["prediction"]["derived"] is False
    assert res["stages"]["decode"]["predicted_s"] > 0 and "predicted_ttft_s" in res["capacity"]
    assert all("predicted_s" in m for m in res["modules"])


def test_analytic_cli_profile_sweep_export(profile_file, tmp_path, capsys):
    out = tmp_path / "sweep.csv"
    assert main(["analytic", "--crops", "1x1,2x2", "--batch", "1,4", "--decode-steps", "0,8",
                 "--profile", str(profile_file), "--session-mode", "fast", "--sweep", str(out)]) == 0
    assert "predicted with" in capsys.readouterr().out
    df = pd.read_csv(out)
    assert len(df) == 8 and df["predicted.session_mode"].eq("fast").all()
    assert (~df["predicted.derived"]).all() and df["predicted.profile"].str.contains("measured").all()
    assert (df["total.predicted_s"] >= 0).all() and "capacity.predicted_pages_per_day" in df
    direct = sweep_columns(ModelSpec(), Points.grid(crops=[(1, 1), (2, 2)], batch=[1, 4], decode_steps=[0, 8]),
                           with_profile(H200, _random_profile(2), "fast"))
    np.testing.assert_allclose(df["decode.predicted_s"], direct["decode.predicted_s"], rtol=1e-9)


def test_analytic_cli_profile_errors(profile_file, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(profile_file.read_text()[:-40])
    assert main(["analytic", "--profile", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "truncated" in err and len(err.strip().splitlines()) == 1
    assert main(["analytic", "--profile", str(profile_file), "--session-mode", "turbo"]) == 2
    assert "--session-mode" in capsys.readouterr().err
    other = json.loads(profile_file.read_text())
    other["format_version"] = 99
    bad.write_text(json.dumps(other))
    assert main(["analytic", "--profile", str(bad)]) == 2
    assert "format_version 99 is not supported" in capsys.readouterr().err


def test_build_profile_is_strict():
    with pytest.raises(Exception, match="no GEMM table"):
        build_profile(device={"name": "x", "kind": "cpu"}, environment={}, versions={},
                      ceilings={"flops_per_s": 1e12, "bytes_per_s": 1e11, "source": "s"},
                      launch={k: 0.0 for k in ("graph_kernel_s", "eager_kernel_s", "host_op_s", "sync_s",
                                               "graph_launch_s")},
                      tables={}, calibration={}, created="2026-01-01")


def test_a_profile_stopped_before_its_memory_tables_is_named_as_unable_to_predict():
    """prediction_gaps: the kernel kinds no table (nor a fallback) of a profile can time; the dashboard refuses
    such a profile up front instead of failing in the middle of a page."""
    from dsocr_core.analytic.predict import prediction_gaps
    from dsocr_core.calibration.profile import profile_from_dict

    full = uniform_profile(989e12, 4.8e12, efficiency=0.5, launch=5e-6, name="NVIDIA H200", kind="cuda")
    assert prediction_gaps(full) == []
    raw = full.to_dict()
    raw["tables"] = {k: v for k, v in raw["tables"].items() if k.startswith("gemm.")}  # stopped inside the GEMMs
    gaps = prediction_gaps(profile_from_dict(raw))
    assert "memory.elementwise" in gaps and "attention.sdpa" in gaps and "gemm" not in gaps


def test_no_kernel_is_predicted_faster_than_its_roofline():
    """A profile may hold efficiencies a little above 1 (MAX_EFFICIENCY); the time model takes them as 1, so with
    the analytic work and no launch cost the prediction is the roofline, never below it."""
    spec, pts = ModelSpec(), Points.grid(crops=[(1, 1), (3, 3)], text_tokens=[10, 900], decode_steps=[0, 64])
    fast = with_profile(H200, uniform_profile(H200.peak_flops, H200.bandwidth, 1.2, 0.0, kind="cuda"),
                        "reference", work="analytic")
    st = evaluate(spec, pts, fast)
    for stage in ("sam", "prefill", "decode", "total"):
        np.testing.assert_allclose(st[stage]["predicted_s"], st[stage]["time_s"], rtol=1e-9)
    assert any("taken as 1" in n for n in fast.prediction.notes)


def test_the_cli_refuses_an_impossible_profile_instead_of_predicting_nan(tmp_path, capsys):
    raw = uniform_profile(H200.peak_flops, H200.bandwidth, 0.5, 1e-6, kind="cuda").to_dict()
    raw["ceilings"]["bytes_per_s"] = 1e-300
    path = tmp_path / "tiny_bandwidth.json"
    path.write_text(json.dumps(raw))
    assert main(["analytic", "--crops", "2x2", "--decode-steps", "10", "--profile", str(path)]) == 2
    out = capsys.readouterr()
    assert "ceilings.bytes_per_s" in out.err and str(path) in out.err and "nan" not in out.out


def test_sams_dense_bias_is_priced_on_its_own_tables_where_the_profile_has_them():
    """The reference SAM's bias (broadcast sum, strided copy) is priced on bias.broadcast / bias.strided; a
    profile without them prices the two exactly as before (elementwise, copy), and slower broadcast and strided
    tables make only the reference SAM slower, never the fast engine's (which folds the bias into q and k)."""
    from pathlib import Path

    from dsocr_core.analytic.predict import profile_hardware, with_profile
    from dsocr_core.calibration.profile import Profile, Table, load_profile
    from dsocr_core.results.prediction_check import predicted_stages
    from dsocr_core.registry import get_family

    base = load_profile(Path(__file__).resolve().parents[1] / "data" / "profiles" / "history" / "h200_2026-11-23.json")
    assert base.table("bias.broadcast") is None and base.table("bias.strided") is None  # this H200 profile predates them
    tables = dict(base.tables)
    for name, source in (("bias.broadcast", "memory.elementwise"), ("bias.strided", "memory.copy")):
        eff = base.table(source).lookup(bytes=1e9) / 3  # a third of the contiguous kernel's, at every shape
        grid = (np.array([1.0, 1e5]), np.array([14.0, 64.0]))
        tables[name] = Table(name, ("bh", "side"), grid, np.full((2, 2), float(eff)), np.ones((2, 2), bool))
    slow = Profile(base.raw, tables, base.path)
    spec = get_family().preset("full")
    w = [Workload(mode="base", batch=4, text_tokens=40, decode_steps=4)]

    def stages(profile, engine):
        return predicted_stages(spec, w, with_profile(profile_hardware(profile), profile, engine))[0]

    # the fast engine's sam_attention="dense" option runs the reference's dense mask: priced the same way
    dense = EngineSpec.of("fast", {"sam_attention": "dense"})
    for engine in ("reference", "fast", dense):
        before, after = stages(base, engine), stages(slow, engine)
        for s in ("clip", "projector", "prefill", "decode"):
            assert after[s] == pytest.approx(before[s], rel=1e-12)
        if engine == "fast":  # the default folds the bias into q and k: no dense mask
            assert after["sam"] == pytest.approx(before["sam"], rel=1e-12)
        else:
            assert after["sam"] > before["sam"] * 1.2  # the bias is a large share of SAM
