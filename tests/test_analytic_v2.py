"""DeepSeek-OCR 2 in the registry and the analytic model: token math, parameter counts, hand-derived FLOPs per view,
the masked encoder's live vs dense work, the CLI, vectorised speed, and v1 left exactly as it was."""
import json
import time

import numpy as np
import pytest

from dsocr_core.analytic import Points, evaluate, module_table, stage_totals
from dsocr_core.analytic.encoder_v2 import live_scores
from dsocr_core.analytic.params import param_breakdown, stage_params, total_params
from dsocr_core.cli import main
from dsocr_core.hardware import get_hardware
from dsocr_core.registry import FAMILIES, family_of_config, get_family, mode_info, stage_rank
from dsocr_core.spec import ModelSpec, SpecError, Workload
from dsocr_core.spec_v2 import OCR2Spec, tiny_spec_v2
from dsocr_core.tiling import crop_grid, slot_layout, token_counts

V2 = OCR2Spec()
HW = get_hardware("h200")


def test_registry_names_both_families_and_keeps_v1_as_default():
    v1, v2 = get_family(), get_family("deepseek-ocr2")
    assert v1.name == "deepseek-ocr" and tuple(FAMILIES) == ("deepseek-ocr", "deepseek-ocr2")
    assert v1.stage_names == ("sam", "clip", "projector", "prefill", "decode")
    assert v2.stage_names == ("sam", "encoder", "projector", "prefill", "decode")
    assert v1.all_stages == ("sam", "clip", "projector", "vision", "prefill", "decode", "total")
    assert tuple(v1.modes) == ("tiny", "small", "base", "large", "gundam", "gundam-m") and v1.default_mode == "gundam"
    assert tuple(v2.modes) == ("dynamic",) and mode_info("dynamic").crop_range == (2, 6)
    assert set(v1.presets) == set(v2.presets) == {"full", "tiny"}
    assert isinstance(v2.preset("tiny"), OCR2Spec) and isinstance(v1.preset("full"), ModelSpec)
    assert stage_rank("clip") == stage_rank("encoder") == 1 and stage_rank("decode") == 5
    with pytest.raises(SpecError, match="unknown model 'deepseek-ocr3'.*deepseek-ocr2"):
        get_family("deepseek-ocr3")
    with pytest.raises(SpecError, match="not a DeepSeek-OCR 2 mode"):
        v2.mode("gundam")


@pytest.mark.parametrize("size, grid, slots", [
    ((1920, 1080), (2, 1), 545),  # |2 - 1.778| beats |3/2 - 1.778|
    ((1024, 1024), (2, 2), 833),  # both sides > 768: tiled, upscaled to 1536^2
    ((1191, 1684), (2, 3), 1121),  # A4 at 144 dpi: the maximum
    ((800, 600), (3, 2), 1121),
    ((768, 768), (1, 1), 257),  # no crops at or under 768 x 768
    ((500, 700), (1, 1), 257),
])
def test_v2_tiling_and_slots(size, grid, slots):
    assert crop_grid(*size, "dynamic") == grid
    tc = token_counts("dynamic", grid)
    assert tc.image_slots == slots == 256 + 1 + 144 * tc.n_tiles
    assert tc.n_tiles in (0, 2, 3, 4, 5, 6)
    assert Workload(mode="dynamic", image_size=size).max_crops == 6  # the mode's own range


def test_v2_slot_layout_has_no_newlines():
    runs = slot_layout(token_counts("dynamic", (3, 2)))
    assert runs == [("local", 144)] * 6 + [("global", 256), ("separator", 1)]
    assert sum(n for _, n in runs) == 1121
    assert ("newline", 1) in slot_layout(token_counts("gundam", (2, 2)))  # v1 keeps its newlines


def test_v2_parameter_counts_match_the_checkpoint():
    assert total_params(V2) == 3_389_119_360 == get_family("deepseek-ocr2").checkpoint.parameters
    assert stage_params(V2) == {"sam": 94_979_328, "encoder": 358_256_512, "projector": 1_148_160 + 1_280,
                                "lm": 2_934_734_080}
    groups = param_breakdown(V2)
    assert groups["encoder"] == 24 * 14_912_384 + 896 + 358_400 and groups["layout"] == 1280
    assert total_params(ModelSpec()) == 3_336_106_240  # v1 unchanged


def _hand_encoder_flops(n: int) -> tuple[int, int]:
    """Hand-derived tensor FLOPs of the encoder on one view of n visual tokens: (dense, live)."""
    h, kv, inter, layers, length = 896, 128, 4864, 24, 2 * n
    linear = 2 * length * (2 * h * h + 2 * h * kv + 3 * h * inter) * layers
    dense = 4 * length * length * h * layers
    live = 4 * (2 * n * n + n * (n + 1) // 2) * h * layers
    return linear + dense, linear + live


def test_v2_view_flops_are_the_hand_derived_figures():
    rows = module_table(V2, Workload(mode="dynamic", image_size=(1024, 1024)))  # global view + 4 crops of 768
    enc = rows[rows.stage == "encoder"]
    dense_g, live_g = _hand_encoder_flops(256)
    dense_c, live_c = _hand_encoder_flops(144)
    assert enc.tensor_flops.sum() == dense_g + 4 * dense_c
    assert enc.tensor_flops_causal.sum() == live_g + 4 * live_c
    assert dense_g == 388_962_975_744  # 366.4 GF linear + 22.5 GF dense attention (L = 512)
    proj = rows[(rows.stage == "projector") & (rows.kind == "projector")]
    assert proj.tensor_flops.sum() == 2 * (256 + 4 * 144) * 896 * 1280
    totals = stage_totals(V2, Workload(mode="dynamic", image_size=(768, 768)))  # the global view alone
    assert totals["sam"]["tensor_flops"] / 1e9 == pytest.approx(976.607, abs=1e-3)  # same SAM as v1 but net_3
    assert totals["vision"]["tensor_flops"] / 1e9 == pytest.approx(1366.157, abs=1e-3)
    crop = stage_totals(V2, Workload(mode="dynamic", crops=(2, 1)))["vision"]["tensor_flops"]
    assert (crop - totals["vision"]["tensor_flops"]) / 2 / 1e9 == pytest.approx(728.022, abs=1e-3)  # per crop


def test_live_fraction_of_the_encoder_mask():
    assert live_scores(1) == 3  # visual sees visual; the query sees the visual token and itself
    assert live_scores(256) / (512 * 512) == pytest.approx(0.6255, abs=1e-4)  # about 63% of the dense work


def test_v2_memory_and_lm_match_v1_decoder():
    w1 = Workload(crops=(2, 2), text_tokens=10, decode_steps=100)  # v1 gundam 2x2: 693 slots
    w2 = Workload(mode="dynamic", crops=(2, 1), text_tokens=10 + 693 - 545, decode_steps=100)  # same prompt length
    assert token_counts("dynamic", (2, 1)).image_slots + w2.text_tokens == 693 + 10
    t1, t2 = stage_totals(ModelSpec(), w1, HW), stage_totals(V2, w2, HW)
    for stage in ("decode",):  # same decoder, same context: same decode cost
        assert t2[stage]["flops"] == t1[stage]["flops"] and t2[stage]["kv_cache_memory"] == t1[stage]["kv_cache_memory"]
    assert t2["decode"]["kv_cache_memory"] == (703 + 100) * 61_440  # 61,440 bytes per cached token (bf16)
    # SAM global-block dense bias: 384 MiB per 1024 view, 121.5 MiB per 768 crop (the row's peak holds it)
    rows = module_table(V2, Workload(mode="dynamic", crops=(2, 1)))
    g = rows[rows.module == "model.sam_model.blocks.2.attn"].peak_activation_memory.item()
    assert g >= 12 * 4096 * 4096 * 2


def test_v2_mode_mismatch_is_a_clear_error():
    with pytest.raises(SpecError, match="not a DeepSeek-OCR 2 mode"):
        stage_totals(V2, Workload(mode="gundam", crops=(2, 2)))
    with pytest.raises(SpecError, match="not a DeepSeek-OCR mode"):
        stage_totals(ModelSpec(), Workload(mode="dynamic", crops=(2, 1)))


def test_v2_sweep_is_vectorised():
    crops = [(1, 1)] + [(w, h) for w in range(1, 7) for h in range(1, 7) if 2 <= w * h <= 6]
    t0 = time.perf_counter()
    pts = Points.grid(mode="dynamic", crops=crops, text_tokens=np.linspace(10, 4010, 121).astype(int),
                      batch=[1, 2, 4, 8, 16, 32, 64, 128], decode_steps=[0, 1, 4, 16, 64, 256, 1024, 4096])
    stages = evaluate(V2, pts, HW)
    elapsed = time.perf_counter() - t0
    assert pts.size >= 100_000 and np.all(np.isfinite(stages["total"]["time_s"]))
    assert set(stages) == set(get_family("deepseek-ocr2").all_stages)
    assert elapsed < 5.0  # >= 100k points/s is the goal (benchmarks/analytic_sweep.py); this guards regressions
    one = stage_totals(V2, Workload(mode="dynamic", crops=crops[3], text_tokens=10, batch=1, decode_steps=0), HW)
    i = int(np.flatnonzero((pts.crops_w == crops[3][0]) & (pts.crops_h == crops[3][1]) & (pts.text_tokens == 10)
                           & (pts.batch == 1) & (pts.decode_steps == 0))[0])
    assert stages["encoder"]["flops"][i] == one["encoder"]["flops"]


def test_config_files_name_their_family(tmp_path):
    cfg2, cfg1 = V2.to_config_dict(), ModelSpec().to_config_dict()
    assert family_of_config(cfg2).name == "deepseek-ocr2" and family_of_config(cfg1).name == "deepseek-ocr"
    assert OCR2Spec.from_config_dict(cfg2) == V2 and OCR2Spec.from_config_dict(tiny_spec_v2().to_config_dict()) \
        == tiny_spec_v2()
    with pytest.raises(SpecError, match="DeepSeek-OCR 2 config.*'deepseek-ocr2'"):
        ModelSpec.from_config_dict(cfg2)
    with pytest.raises(SpecError, match="DeepSeek-OCR config.*'deepseek-ocr'"):
        OCR2Spec.from_config_dict(cfg1)


def test_official_v2_config_with_its_stale_sam_width_reads_as_the_official_spec():
    """The official config.json states downsample_channels [512, 1024]; the vendor code builds 896."""
    cfg = V2.to_config_dict()
    sam = {"downsample_channels": [512, 1024], "global_attn_indexes": [2, 5, 8, 11], "heads": 12, "layers": 12,
           "width": 768}
    cfg["vision_config"]["width"] = {"qwen2-0-5b": {"dim": 896}, "sam_vit_b": sam}
    cfg["vision_config"]["mlp_ratio"] = 3.7362
    assert OCR2Spec.from_config_dict(cfg) == V2


def test_cli_analytic_v2(capsys):
    assert main(["analytic", "--model", "deepseek-ocr2", "--image", "1920x1080", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokens"]["image_slots"] == 545 and out["tokens"]["mode"] == "dynamic"
    assert out["tokens"]["crops"] == [2, 1]
    assert list(out["stages"]) == ["sam", "encoder", "projector", "vision", "prefill", "decode", "total"]
    assert out["stages"]["encoder"]["tensor_flops"] == _hand_encoder_flops(256)[0] + 2 * _hand_encoder_flops(144)[0]
    assert out["stages"]["vision"]["time_s"] > 0
    assert main(["analytic", "--model", "deepseek-ocr2", "--mode", "gundam"]) == 2
    assert "unknown value 'gundam'" in capsys.readouterr().err
