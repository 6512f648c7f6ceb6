"""Vision stages, the vision-token layout and the full forward on a tiny synthetic model; FLOP counts against the
contract formulas (docs/model-contract.md)."""
import math

import pytest
import torch

from dsocr_core.model import flop_counter, meta_model, synthetic_model
from dsocr_core.spec import ModelSpec, tiny_spec
from dsocr_core.tiling import MODES, token_counts


@pytest.fixture(scope="module")
def tiny():
    return synthetic_model(tiny_spec(), seed=0, dtype="float32")


def pixels(n, side, seed=0):
    return torch.rand(n, 3, side, side, generator=torch.Generator().manual_seed(seed)) * 2 - 1


@pytest.mark.parametrize("side", [512, 640, 1024])
def test_stage_shapes(tiny, side):
    s = tiny.spec
    g = side // 64
    with torch.inference_mode():
        sam = tiny.model.sam_model(pixels(2, side))
        clip = tiny.model.vision_model(sam)
        feats = tiny.model.project(clip, sam)
    assert sam.shape == (2, s.sam_downsample[1], g, g)
    assert clip.shape == (2, 1 + g * g, s.clip_width)
    assert feats.shape == (2, g * g, s.hidden_size)
    assert torch.isfinite(feats).all()


def image_inputs(mode, grid=(1, 1), text_before=1, text_after=9, spec=None, device="cpu", seed=0):
    """Prompt ids, mask, images and crop grid for one image, as the vendor HF path builds them."""
    spec = spec or tiny_spec()
    info = MODES[mode]
    counts = token_counts(mode, grid)
    n = counts.image_slots
    seq = text_before + n + text_after
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 1000, (1, seq), generator=gen)
    ids[0, 0] = spec.bos_token_id
    ids[0, text_before:text_before + n] = spec.image_token_id
    mask = torch.zeros(1, seq, dtype=torch.bool)
    mask[0, text_before:text_before + n] = True
    if grid == (1, 1):
        crops = torch.zeros(1, 3, info.base_size, info.base_size)
    else:
        crops = pixels(grid[0] * grid[1], info.tile_size, seed + 1)
    glob = pixels(1, info.base_size, seed + 2)
    images = [(crops.to(device), glob.to(device))]
    return ids.to(device), mask.to(device), images, torch.tensor([list(grid)]), counts


@pytest.mark.parametrize("mode,grid", [("tiny", (1, 1)), ("small", (1, 1)), ("base", (1, 1)), ("gundam", (2, 2))])
def test_layout_slots_equal_token_counts(tiny, mode, grid):
    ids, mask, images, crop, counts = image_inputs(mode, grid)
    with torch.inference_mode():
        emb = tiny.model.vision_embeddings(images, crop)
        logits, cache = tiny(ids, images=images, images_seq_mask=mask, images_spatial_crop=crop, logits="last")
    assert len(emb) == 1 and emb[0].shape == (counts.image_slots, tiny.spec.hidden_size)
    assert logits.shape == (1, 1, tiny.spec.vocab_size) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    assert cache.length == ids.shape[1]
    assert cache.keys[0].shape == (1, tiny.spec.num_attention_heads, ids.shape[1], tiny.spec.head_dim)


def test_layout_order(tiny):
    """Tiles raster-stitched, newline after every row, global after local, separator last."""
    m = tiny.model
    H = tiny.spec.hidden_size
    t, g, (tw, th) = 2, 3, (3, 2)
    local = torch.arange(tw * th * t * t, dtype=torch.float32)[:, None].repeat(1, H).view(tw * th, t * t, H) + 1000
    glob = torch.arange(g * g, dtype=torch.float32)[:, None].repeat(1, H)
    with torch.no_grad():
        out = m.layout_image(glob, local, (tw, th))
    assert out.shape[0] == th * t * (tw * t + 1) + g * (g + 1) + 1
    nl, sep = m.image_newline.detach(), m.view_seperator.detach()
    row_len = tw * t + 1
    for r in range(th * t):
        row = out[r * row_len:(r + 1) * row_len]
        assert torch.equal(row[-1], nl)
        tile_r, y = divmod(r, t)
        for c in range(tw * t):
            tile_c, x = divmod(c, t)
            tile = tile_r * tw + tile_c  # row-major tile order
            assert row[c, 0].item() == 1000 + tile * t * t + y * t + x
    rest = out[th * t * row_len:]
    for r in range(g):
        assert torch.equal(rest[r * (g + 1) + g], nl)
        assert rest[r * (g + 1):r * (g + 1) + g, 0].tolist() == [float(r * g + c) for c in range(g)]
    assert torch.equal(out[-1], sep)


def test_untiled_row_runs_no_crops(tiny):
    """grid (1, 1): the zeros crops tensor is ignored; SAM sees exactly one view per image."""
    batches = []
    hook = tiny.model.sam_model.register_forward_hook(lambda mod, inp, out: batches.append(inp[0].shape[0]))
    try:
        with torch.inference_mode():
            _, _, images, crop, counts = image_inputs("tiny")
            emb = tiny.model.vision_embeddings(images, crop)
    finally:
        hook.remove()
    assert batches == [1]
    assert emb[0].shape[0] == counts.image_slots == 73


def test_decode_step_never_runs_vision(tiny):
    calls = []
    hooks = [mod.register_forward_hook(lambda *a, n=name: calls.append(n))
             for name, mod in [("sam", tiny.model.sam_model), ("clip", tiny.model.vision_model),
                               ("proj", tiny.model.projector)]]
    try:
        ids, mask, images, crop, _ = image_inputs("tiny")
        with torch.inference_mode():
            logits, cache = tiny(ids, images=images, images_seq_mask=mask, images_spatial_crop=crop, logits="last")
            assert calls == ["sam", "clip", "proj"]
            calls.clear()
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            # images passed again on a decode step (as generate() does) must still be ignored
            step, cache = tiny(nxt, images=images, images_seq_mask=mask, images_spatial_crop=crop, cache=cache)
    finally:
        for h in hooks:
            h.remove()
    assert calls == []
    assert step.shape == (1, 1, tiny.spec.vocab_size) and cache.length == ids.shape[1] + 1


def test_image_slots_land_in_mask_positions(tiny):
    ids, mask, images, crop, _ = image_inputs("tiny")
    with torch.inference_mode():
        emb = tiny.model.vision_embeddings(images, crop)
        x = tiny.model.embed(ids, mask, emb)
        plain = tiny.model.embed_tokens(ids)
    assert torch.equal(x[0, mask[0]], emb[0])
    assert torch.equal(x[0, ~mask[0]], plain[0, ~mask[0]])
    with pytest.raises(ValueError, match="image slots"):
        tiny.model.embed(ids, mask, [emb[0][:-1]])


def test_bf16_forward_finite():
    model = synthetic_model(tiny_spec(), seed=1, dtype="bfloat16")
    ids, mask, images, crop, _ = image_inputs("small")
    with torch.inference_mode():
        logits, _ = model(ids, images=images, images_seq_mask=mask, images_spatial_crop=crop, logits="all")
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()


# --- FLOPs: the contract's formulas written independently ---
def sam_flops(s: ModelSpec, side: int, views: int = 1) -> int:
    W, M, nh, ws = s.sam_width, s.sam_mlp_dim, s.sam_heads, s.sam_window
    d = W // nh
    P = side // s.sam_patch
    f = 2 * P * P * W * 3 * s.sam_patch ** 2
    for b in range(s.sam_layers):
        if b in s.sam_global_blocks:
            nw, side_tokens = 1, P
        else:
            pp = math.ceil(P / ws) * ws
            nw, side_tokens = (pp // ws) ** 2, ws
        n = side_tokens ** 2
        f += 2 * nw * n * W * 3 * W + 2 * nw * n * W * W  # qkv, proj on padded windows
        f += 2 * 2 * (nw * nh) * side_tokens ** 3 * d  # rel_h + rel_w einsums
        f += 4 * (nw * nh) * n * n * d  # SDPA
        f += 2 * P * P * W * M * 2  # MLP, unpadded
    nk, (c1, c2) = s.sam_neck_dim, s.sam_downsample
    f += 2 * P * P * W * nk + 2 * P * P * nk * nk * 9 + 2 * (P // 2) ** 2 * nk * c1 * 9 + 2 * (P // 4) ** 2 * c1 * c2 * 9
    return f * views


def clip_proj_flops(s: ModelSpec, side: int, views: int = 1) -> int:
    g = side // 64
    n, C, Mc = g * g + 1, s.clip_width, s.clip_mlp_dim
    per_layer = 2 * n * C * 3 * C + 4 * n * n * C + 2 * n * C * C + 2 * n * C * Mc * 2
    return views * (s.clip_layers * per_layer + 2 * g * g * s.projector_input_dim * s.hidden_size)


def lm_flops(s: ModelSpec, b: int, s_q: int, s_kv: int, logits_rows: int) -> int:
    H, T = s.hidden_size, b * s_q
    f = 0
    for i in range(s.num_hidden_layers):
        f += 4 * 2 * T * H * H + 4 * b * s_q * s_kv * H
        if i < s.first_k_dense_replace:
            f += 3 * 2 * T * H * s.intermediate_size
        else:
            f += 2 * T * H * s.n_routed_experts
            f += 3 * 2 * T * s.num_experts_per_tok * H * s.moe_intermediate_size
            f += 3 * 2 * T * H * s.n_shared_experts * s.moe_intermediate_size
    return f + 2 * logits_rows * H * s.vocab_size


@pytest.mark.parametrize("side", [512, 640])
def test_sam_flops_cpu_tiny(tiny, side):
    with torch.inference_mode(), flop_counter() as fc:
        tiny.model.sam_model(pixels(1, side))
    assert fc.get_total_flops() == sam_flops(tiny.spec, side)


@pytest.mark.parametrize("side,views", [(1024, 1), (640, 3), (1280, 1)])
def test_sam_flops_meta_full(side, views):
    spec = ModelSpec()
    model = meta_model(spec)
    with flop_counter() as fc:
        model.model.sam_model(torch.empty(views, 3, side, side, device="meta"))
    assert fc.get_total_flops() == sam_flops(spec, side, views)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_full_forward_flops_meta(attn):
    """Gundam 2x2 prefill with logits 'all', then one decode step with logits 'last', on the meta device."""
    spec = ModelSpec()
    model = meta_model(spec, attn_impl=attn)
    ids, mask, images, crop, counts = image_inputs("gundam", (2, 2), spec=spec, device="meta")
    seq = ids.shape[1]
    with flop_counter() as fc:
        logits, cache = model(ids, images=images, images_seq_mask=mask, images_spatial_crop=crop, logits="all")
    assert logits.shape == (1, seq, spec.vocab_size) and cache.length == seq
    want = (sam_flops(spec, 640, 4) + sam_flops(spec, 1024) + clip_proj_flops(spec, 640, 4)
            + clip_proj_flops(spec, 1024) + lm_flops(spec, 1, seq, seq, seq))
    assert fc.get_total_flops() == want
    with flop_counter() as fc:
        model(torch.zeros(1, 1, dtype=torch.long, device="meta"), cache=cache, logits="last")
    assert fc.get_total_flops() == lm_flops(spec, 1, 1, seq + 1, 1)


def test_sam_flops_by_module_meta():
    """Per-module attribution: rel-pos einsums and SDPA count inside blocks.{b}.attn, not in qkv/proj."""
    spec = ModelSpec()
    model = meta_model(spec)
    with flop_counter(depth=10) as fc:
        model.model.sam_model(torch.empty(1, 3, 1024, 1024, device="meta"))
    counts = {k: sum(v.values()) for k, v in fc.get_flop_counts().items()}
    pre = "SamEncoder.blocks.2.attn"  # FlopCounterMode names from the called module
    P, W, nh, d = 64, 768, 12, 64
    assert counts[pre + ".qkv"] == 2 * P * P * W * 3 * W
    assert counts[pre] - counts[pre + ".qkv"] - counts[pre + ".proj"] == 2 * 2 * nh * P ** 3 * d + 4 * nh * (P * P) ** 2 * d
