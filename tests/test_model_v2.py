"""Our PyTorch DeepSeek-OCR 2: the checkpoint's tensor names and shapes, strict loading of a random checkpoint
written by make-checkpoint, the encoder's mask semantics, FLOPs exact against FlopCounterMode (full size on the
meta device, tiny on the CPU), and separated prefill + decode token-exact against one-shot generation."""
import json
import math

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from dsocr_core.analytic import decode_step_table, module_table, stage_totals
from dsocr_core.cli import main
from dsocr_core.model import flop_counter
from dsocr_core.model.checkpoint import CheckpointError, expected_shapes, load_model, meta_model, synthetic_model
from dsocr_core.model.encoder_v2 import encoder_mask
from dsocr_core.registry import mode_info
from dsocr_core.runtime.inputs import image_views, prepare_inputs
from dsocr_core.runtime.session import Session
from dsocr_core.spec import SpecError, Workload
from dsocr_core.spec_v2 import OCR2Spec, tiny_spec_v2
from dsocr_core.tiling import token_counts
from test_analytic_flops import check_rows, counts_by_path

ENC = "model.qwen2_model.model.model"


def test_full_v2_tensors_are_the_official_names_and_shapes():
    shapes = expected_shapes(OCR2Spec())
    assert len(shapes) == 2707 and sum(math.prod(s) for s in shapes.values()) == 3_389_119_360
    for name, shape in {
        "model.sam_model.net_3.weight": (896, 512, 3, 3),
        f"{ENC}.layers.0.self_attn.q_proj.weight": (896, 896), f"{ENC}.layers.23.self_attn.q_proj.bias": (896,),
        f"{ENC}.layers.5.self_attn.k_proj.weight": (128, 896), f"{ENC}.layers.5.self_attn.v_proj.bias": (128,),
        f"{ENC}.layers.7.self_attn.o_proj.weight": (896, 896),
        f"{ENC}.layers.7.mlp.gate_proj.weight": (4864, 896), f"{ENC}.layers.7.mlp.down_proj.weight": (896, 4864),
        f"{ENC}.layers.0.input_layernorm.weight": (896,), f"{ENC}.norm.weight": (896,),
        "model.qwen2_model.query_768.weight": (144, 896), "model.qwen2_model.query_1024.weight": (256, 896),
        "model.projector.layers.weight": (1280, 896), "model.projector.layers.bias": (1280,),
        "model.view_seperator": (1280,), "lm_head.weight": (129280, 1280),
        "model.layers.3.mlp.experts.63.up_proj.weight": (896, 1280),
    }.items():
        assert shapes[name] == shape, name
    assert f"{ENC}.layers.0.self_attn.o_proj.bias" not in shapes
    assert not [n for n in shapes if "image_newline" in n or "vision_model" in n]


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    out = tmp_path_factory.mktemp("v2") / "ckpt"
    assert main(["make-checkpoint", "--model", "deepseek-ocr2", "--preset", "tiny", "--out", str(out),
                 "--dtype", "float32", "--seed", "3"]) == 0
    return out


def test_make_checkpoint_writes_the_official_layout_and_loads_strictly(tiny_ckpt):
    cfg = json.loads((tiny_ckpt / "config.json").read_text())
    assert cfg["architectures"] == ["DeepseekOCR2ForCausalLM"] and cfg["vision_config"]["model_name"] == "deepencoderv2"
    assert cfg["projector_config"]["input_dim"] == 48
    model, spec, info = load_model(tiny_ckpt, dtype="float32")
    assert spec == tiny_spec_v2() and type(model).__name__ == "DeepseekOCR2ForCausalLM"
    assert info["tensors"] == len(expected_shapes(tiny_spec_v2())) and info["ignored"] == []
    ref = synthetic_model(tiny_spec_v2(), seed=3, dtype="float32")
    for (n, a), (m, b) in zip(model.state_dict().items(), ref.state_dict().items()):
        assert n == m and torch.equal(a, b), n


def test_loading_refuses_a_broken_v2_checkpoint(tiny_ckpt, tmp_path):
    state = load_file(tiny_ckpt / "model.safetensors")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((tiny_ckpt / "config.json").read_text())
    state.pop("model.qwen2_model.query_768.weight")
    state["model.image_newline"] = torch.zeros(64)  # a v1 tensor has no place in v2
    save_file(state, broken / "model.safetensors")
    missing = "missing model.qwen2_model.query_768.weight.*unexpected model.image_newline"
    with pytest.raises(CheckpointError, match=missing):
        load_model(broken, dtype="float32")
    with pytest.raises(ValueError, match="DeepSeek-OCR 2 checkpoint, not DeepSeek-OCR"):
        Session.load(checkpoint=tiny_ckpt, model="deepseek-ocr", device="cpu", dtype="float32")


def test_encoder_mask_is_the_papers():
    m = encoder_mask(3, torch.float32, "cpu")[0, 0]
    allowed = (m == 0).int().tolist()
    assert allowed == [[1, 1, 1, 0, 0, 0]] * 3 + [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]]
    assert m.min().item() == torch.finfo(torch.float32).min


def test_queries_are_causal_and_visual_tokens_ignore_queries():
    """Changing query j moves the outputs of queries >= j only; the encoder's visual outputs see no query."""
    torch.manual_seed(0)
    model = synthetic_model(tiny_spec_v2(), seed=1, dtype="float32")
    enc = model.model.qwen2_model
    sam = torch.randn(1, 48, 12, 12)
    with torch.no_grad():
        base = enc(sam)
        enc.query_768.weight[100] += 1.0
        moved = enc(sam)
    changed = (base - moved).abs().amax(-1)[0] > 0
    assert not changed[:100].any() and changed[100:].all()
    with pytest.raises(ValueError, match="no query table for a view of 100 visual tokens"):
        enc(torch.randn(1, 48, 10, 10))


def test_preprocessing_is_the_vendors():
    img = Image.new("RGB", (1920, 1080), (255, 0, 0))
    v = image_views(img, "dynamic")
    assert v.grid == (2, 1) and tuple(v.crops.shape) == (2, 3, 768, 768)
    assert tuple(v.global_view.shape) == (1, 3, 1024, 1024) and v.counts.image_slots == 545
    g = v.global_view[0]
    # 1920x1080 -> 1024x576 centred: grey 127 bands above and below, normalised with mean = std = 0.5
    assert g[:, 0, 0].tolist() == pytest.approx([127 / 255 * 2 - 1] * 3)
    assert g[:, 512, 512].tolist() == pytest.approx([1.0, -1.0, -1.0])
    small = image_views(Image.new("RGB", (700, 500)), "dynamic")
    assert small.grid == (1, 1) and small.counts.image_slots == 257


def model_inputs(mode, grid, text_tokens, batch, device):
    info, tc = mode_info(mode), token_counts(mode, grid)
    seq = tc.image_slots + text_tokens
    ids = torch.zeros(batch, seq, dtype=torch.long, device=device)
    mask = torch.zeros(batch, seq, dtype=torch.bool)
    mask[:, 1:1 + tc.image_slots] = True
    glob = torch.zeros(1, 3, info.base_size, info.base_size, device=device)
    crops = torch.zeros(tc.n_tiles, 3, info.tile_size, info.tile_size, device=device) if tc.n_tiles else None
    return dict(input_ids=ids, images=[(crops, glob)] * batch, images_seq_mask=mask.to(device),
                images_spatial_crop=[list(grid)] * batch), seq


def compare_flops(model, spec, workload, device):
    kw, seq = model_inputs(workload.mode, workload.crops or (1, 1), workload.text_tokens, workload.batch, device)
    with torch.inference_mode(), flop_counter(depth=100) as fc:
        _, cache = model(**kw, logits=workload.logits)
    totals = stage_totals(spec, workload)
    assert fc.get_total_flops() == totals["vision"]["tensor_flops"] + totals["prefill"]["tensor_flops"]
    check_rows(module_table(spec, workload), counts_by_path(fc), ("sam", "encoder", "projector", "prefill"))
    step = torch.zeros(workload.batch, 1, dtype=torch.long, device=device)
    with torch.inference_mode(), flop_counter(depth=100) as fc:
        model(step, cache=cache, logits="last")
    table = decode_step_table(spec, workload, context=seq)
    assert fc.get_total_flops() == table.tensor_flops.sum()


@pytest.mark.parametrize("grid,text,batch", [((2, 1), 10, 1), ((1, 1), 200, 2), ((3, 2), 10, 1)])
def test_full_v2_flops_exact_on_meta(grid, text, batch):
    spec = OCR2Spec()
    compare_flops(meta_model(spec), spec, Workload(mode="dynamic", crops=None if grid == (1, 1) else grid,
                                                   text_tokens=text, batch=batch), "meta")


def test_tiny_v2_flops_exact_on_cpu():
    spec = tiny_spec_v2()
    compare_flops(synthetic_model(spec, dtype="float32"), spec, Workload(mode="dynamic", crops=(2, 2),
                                                                         text_tokens=12, dtype="float32"), "cpu")


@pytest.fixture(scope="module")
def tiny_session(tiny_ckpt):
    return Session.load(checkpoint=tiny_ckpt, device="cpu", dtype="float32")


def test_tiny_v2_separated_equals_one_shot(tiny_session):
    s = tiny_session
    assert s.family.name == "deepseek-ocr2" and s.describe()["model"] == "deepseek-ocr2"
    inputs = s.prepare(Image.new("RGB", (1600, 900), (240, 230, 220)))
    assert inputs.mode == "dynamic" and inputs.image_slots == 545
    result = s.generate_separated(inputs, max_new_tokens=8)
    v = result.verification
    assert v["passed"] and v["tokens_equal_one_shot"] and v["vision_calls_in_decode"] == 0
    assert v["vision_calls_in_prefill"] == 6  # SAM, encoder, projector: one call per view size (1024 and 768)
    assert set(result.timings) >= {"sam", "encoder", "projector", "prefill", "ttft_s"}
    assert "clip" not in result.timings
    flops = s.count_stage_flops(inputs, decode_steps=1)
    assert set(flops) == {"sam", "encoder", "projector", "prefill", "decode"}
    with pytest.raises(SpecError, match="not a DeepSeek-OCR 2 mode"):
        s.prepare(Image.new("RGB", (64, 64)), mode="gundam")


def test_prepare_inputs_v2_prompt_layout():
    inputs = prepare_inputs(Image.new("RGB", (1024, 1024)), mode="dynamic")
    assert inputs.image_slots == 833 and inputs.token_counts.n_tiles == 4
    assert inputs.input_ids[0, 0].item() == 0  # BOS, then the slots
