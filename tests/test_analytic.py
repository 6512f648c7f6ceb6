"""Analytic model: parameters, per-view encoder FLOPs, decode traffic, MoE expert touch, byte/memory models,
stage bookkeeping and per-module tables (fast, CPU, no torch model needed)."""
import math

import numpy as np
import pytest

from dsocr_core.analytic import (STAGES, activated_params, decode_step_totals, expected_experts,
                                 module_table, param_breakdown, param_counts, stage_params, stage_totals,
                                 total_params)
from dsocr_core.analytic.cost import sum_of_max
from dsocr_core.hardware import get_hardware
from dsocr_core.spec import ModelSpec, Workload, tiny_spec

SPEC = ModelSpec()
H200 = get_hardware("h200")
REQUIRED = ("flops", "tensor_flops", "other_flops", "bytes", "weight_bytes", "activation_bytes", "kv_bytes",
            "weight_memory", "peak_activation_memory", "kv_cache_memory", "time_s", "bound")


# --- parameters (official checkpoint: 3,336,106,240 in all, 574,127,360 activated per decoded token) ---
def test_parameter_counts_match_facts():
    assert total_params(SPEC) == 3_336_106_240
    assert activated_params(SPEC) == 574_127_360
    assert sum(param_counts(SPEC).values()) == total_params(SPEC)
    assert param_breakdown(SPEC) == {
        "embed": 165_478_400, "lm_head": 165_478_400, "attention": 78_643_200, "dense_mlp": 26_296_320,
        "routed_experts": 2_422_210_560, "shared_experts": 75_694_080, "gates": 901_120, "norms": 32_000,
        "sam": 95_569_152, "clip": 303_177_728, "projector": 2_622_720, "layout": 2_560}
    assert stage_params(SPEC)["lm"] == 2_934_734_080


def test_weight_memory_is_every_parameter_once():
    t = stage_totals(SPEC, Workload(crops=(2, 2), decode_steps=5))
    assert t["total"]["weight_memory"] == total_params(SPEC) * 2
    assert t["prefill"]["weight_memory"] == t["decode"]["weight_memory"] == 2_934_734_080 * 2
    assert t["vision"]["weight_memory"] == (95_569_152 + 303_177_728 + 2_622_720 + 2_560) * 2


# --- vision encoder per view (SAM + CLIP + projector: ~268, 388, 1,140, 1,943 GFLOP at 512, 640, 1024, 1280 px) ---
@pytest.mark.parametrize("mode,gflop", [("tiny", 268), ("small", 388), ("base", 1140), ("large", 1943)])
def test_encoder_flops_per_view(mode, gflop):
    t = stage_totals(SPEC, Workload(mode=mode))
    assert t["vision"]["tensor_flops"] / 1e9 == pytest.approx(gflop, rel=2e-3)


def test_gundam_vision_is_global_plus_tiles_and_scales_with_batch():
    base = stage_totals(SPEC, Workload(mode="base"))["vision"]["tensor_flops"]
    small = stage_totals(SPEC, Workload(mode="small"))["vision"]["tensor_flops"]
    g22 = stage_totals(SPEC, Workload(crops=(2, 2)))
    assert g22["vision"]["tensor_flops"] == pytest.approx(base + 4 * small, rel=1e-3)  # 1024 global + 4 x 640
    g22b = stage_totals(SPEC, Workload(crops=(2, 2), batch=3))
    for stage in ("sam", "clip", "projector"):
        assert g22b[stage]["tensor_flops"] == 3 * g22[stage]["tensor_flops"]
    untiled = stage_totals(SPEC, Workload(mode="gundam"))  # global view only: nothing runs for the placeholder
    assert untiled["vision"]["tensor_flops"] == pytest.approx(base, rel=1e-3)


def test_sam_global_mask_in_peak_memory():
    """The dense relative-position mask of a global block: [views*12, 4096, 4096] in bf16 = 384 MiB per view."""
    t = stage_totals(SPEC, Workload(mode="base"))
    mask = 12 * 4096 * 4096 * 2
    assert mask == 384 * 2 ** 20
    assert mask < t["sam"]["peak_activation_memory"] < 1.2 * mask


# --- LM decode traffic ---
@pytest.mark.parametrize("batch,context", [(1, 703), (8, 100), (64, 5000)])
def test_decode_bytes_cover_touched_weights_and_kv(batch, context):
    s = SPEC
    step = decode_step_totals(s, Workload(batch=batch), context, H200)
    h, layers, dt = s.hidden_size, s.num_hidden_layers, 2
    expert = 3 * h * s.moe_intermediate_size
    fixed = activated_params(s) - len(s.moe_layers) * s.num_experts_per_tok * expert  # all but routed experts
    touched = (fixed + len(s.moe_layers) * expected_experts(64, 6, batch) * expert) * dt
    kv_read = batch * context * 2 * layers * h * dt
    kv_write = batch * 1 * 2 * layers * h * dt
    assert step["kv_read_bytes"] == kv_read and step["kv_write_bytes"] == kv_write
    assert step["weight_bytes"] >= touched
    assert step["weight_bytes"] == pytest.approx(touched + batch * h * dt)  # + the gathered embedding rows
    assert step["bytes"] >= touched + kv_read + kv_write
    assert step["kv_cache_memory"] == batch * (context + 1) * 61_440
    if batch == 1:
        assert step["weight_bytes"] == pytest.approx(1.148e9, rel=1e-3)  # ~1.15 GB of weights per token


def test_expected_distinct_experts():
    assert expected_experts(64, 6, 1) == pytest.approx(6)
    assert expected_experts(64, 6, 0) == 0
    values = expected_experts(64, 6, np.arange(1, 200))
    assert np.all(np.diff(values) > 0) and values[-1] < 64
    assert expected_experts(64, 6, 1000) == pytest.approx(64)
    assert expected_experts(64, 6, 2) == pytest.approx(64 * (1 - (58 / 64) ** 2))


def test_decode_summed_over_steps_equals_loop_over_contexts():
    w = Workload(crops=(2, 1), text_tokens=37, batch=3, decode_steps=9, attn="eager")
    seq = 483 + 37
    total = stage_totals(SPEC, w, H200)["decode"]
    steps = [decode_step_totals(SPEC, w, seq + i, H200) for i in range(9)]
    for key in ("tensor_flops", "tensor_flops_causal", "other_flops", "bytes", "weight_bytes", "kv_bytes",
                "activation_bytes", "compute_s", "memory_s", "time_s"):
        assert total[key] == pytest.approx(sum(s[key] for s in steps), rel=1e-12), key
    assert total["peak_activation_memory"] == steps[-1]["peak_activation_memory"]
    assert total["kv_cache_memory"] == w.batch * (seq + 9) * 61_440


def test_sum_of_max_matches_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(0, 40))
        c0, c1, m0, m1 = rng.normal(size=4) * 10 + 5
        if n == 1:  # one step: its first and last values are the same step
            c1, m1 = c0, m0
        i = np.arange(n)
        f = lambda a, b: a + (b - a) * i / max(n - 1, 1)  # noqa: E731
        want = np.maximum(f(c0, c1), f(m0, m1)).sum() if n else 0.0
        assert sum_of_max(c0, c1, m0, m1, n) == pytest.approx(want, rel=1e-9, abs=1e-9)


def test_attention_implementations():
    w = Workload(crops=(2, 2), text_tokens=500)
    sdpa, eager, flash = (stage_totals(SPEC, w.model_copy(update={"attn": a}))["prefill"]
                          for a in ("sdpa", "eager", "flash"))
    assert sdpa["tensor_flops"] == eager["tensor_flops"] == flash["tensor_flops"]  # FlopCounterMode convention
    assert sdpa["activation_bytes"] == flash["activation_bytes"] < eager["activation_bytes"]
    s = 1193 * 10 * 1193  # score elements per layer at batch 1
    assert eager["activation_bytes"] - sdpa["activation_bytes"] == pytest.approx(12 * s * (2 * 4 * 2 + 16))
    # causal-effective attention: S(S+1)/2 pairs instead of S^2
    n = 1193
    assert sdpa["tensor_flops"] - sdpa["tensor_flops_causal"] == 12 * 4 * 1280 * (n * n - n * (n + 1) // 2)


def test_logits_all_versus_last():
    w = Workload(crops=(2, 2))
    all_, last = (module_table(SPEC, w.model_copy(update={"logits": m})) for m in ("all", "last"))
    head = lambda t: t[(t.stage == "prefill") & (t.module == "lm_head")].iloc[0]  # noqa: E731
    assert head(all_).tensor_flops == 703 * head(last).tensor_flops == 703 * 2 * 1280 * 129_280
    assert head(all_).peak_activation_memory > 703 * 129_280 * 4  # fp32 logits of every position


def test_module_table_sums_to_stage_totals():
    w = Workload(crops=(3, 2), text_tokens=20, batch=2, decode_steps=4)
    table = module_table(SPEC, w, H200)
    totals = stage_totals(SPEC, w, H200)
    for stage in ("sam", "clip", "projector", "prefill", "decode"):
        part = table[table.stage == stage]
        assert part.module.is_unique
        for key in ("tensor_flops", "other_flops", "bytes", "weight_bytes", "kv_bytes", "weight_memory",
                    "kv_cache_memory", "time_s"):
            assert part[key].sum() == pytest.approx(totals[stage][key], rel=1e-12), (stage, key)
        assert part.peak_activation_memory.max() == totals[stage]["peak_activation_memory"]
    assert set(table.bound) <= {"compute", "memory", "none"}
    assert table.module.iloc[0] == "model.sam_model.patch_embed" and table.module.iloc[-1] == "lm_head"
    sam = table[table.stage == "sam"].module.tolist()
    assert sam.index("model.sam_model.blocks.1.mlp") < sam.index("model.sam_model.blocks.2.norm1")
    experts = table[(table.stage == "prefill") & table.module.str.endswith("mlp.experts")]
    assert len(experts) == 11


def test_stage_json_shape_and_consistency():
    t = stage_totals(SPEC, Workload(crops=(2, 2), decode_steps=10), H200)
    assert tuple(t) == STAGES
    for stage, values in t.items():
        for key in REQUIRED:
            assert key in values, (stage, key)
        assert values["flops"] == values["tensor_flops"] + values["other_flops"]
        assert values["bytes"] == pytest.approx(values["weight_bytes"] + values["activation_bytes"]
                                                + values["kv_bytes"])
        assert values["time_s"] >= max(values["compute_s"], values["memory_s"]) * (1 - 1e-12)
    for key in ("flops", "bytes", "time_s"):
        assert t["vision"][key] == pytest.approx(t["sam"][key] + t["clip"][key] + t["projector"][key])
        assert t["total"][key] == pytest.approx(t["vision"][key] + t["prefill"][key] + t["decode"][key])
    assert t["decode"]["bound"] == "memory"
    assert t["prefill"]["kv_cache_memory"] == 703 * 61_440
    assert t["total"]["kv_cache_memory"] == t["decode"]["kv_cache_memory"] == 713 * 61_440
    none = stage_totals(SPEC, Workload(), H200)["decode"]
    assert none["flops"] == 0 and none["bound"] == "none" and none["kv_cache_memory"] == 0


def test_tiny_spec_runs_through():
    t = stage_totals(tiny_spec(), Workload(crops=(2, 3), decode_steps=3, batch=2), H200)
    assert all(t[s]["tensor_flops"] > 0 for s in ("sam", "clip", "projector", "prefill", "decode"))


def test_no_hardware_means_no_times():
    t = stage_totals(SPEC, Workload())
    assert "time_s" not in t["prefill"] and math.isfinite(t["prefill"]["bytes"])
