"""Parameter names and shapes against the official checkpoint's tensor listing (2,710 bf16 tensors), for any spec
size."""
import pytest
import torch

from dsocr_core.model import DeepseekOCRForCausalLM, expected_shapes, meta_model
from dsocr_core.spec import ModelSpec, tiny_spec


def facts_table(s: ModelSpec) -> dict[str, tuple[int, ...]]:
    """The official checkpoint's tensor names and shapes, written out independently of the model code."""
    t: dict[str, tuple[int, ...]] = {}
    H, V = s.hidden_size, s.vocab_size
    t["lm_head.weight"] = (V, H)
    t["model.embed_tokens.weight"] = (V, H)
    t["model.norm.weight"] = (H,)
    for i in range(s.num_hidden_layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = (H,)
        t[p + "post_attention_layernorm.weight"] = (H,)
        for n in "qkvo":
            t[p + f"self_attn.{n}_proj.weight"] = (H, H)
        if i < s.first_k_dense_replace:
            mlps = {"mlp.": s.intermediate_size}
        else:
            t[p + "mlp.gate.weight"] = (s.n_routed_experts, H)
            mlps = {f"mlp.experts.{e}.": s.moe_intermediate_size for e in range(s.n_routed_experts)}
            mlps["mlp.shared_experts."] = s.n_shared_experts * s.moe_intermediate_size
        for q, inter in mlps.items():
            t[p + q + "gate_proj.weight"] = (inter, H)
            t[p + q + "up_proj.weight"] = (inter, H)
            t[p + q + "down_proj.weight"] = (H, inter)
    t["model.image_newline"] = (H,)
    t["model.view_seperator"] = (H,)
    t["model.projector.layers.weight"] = (H, s.projector_input_dim)
    t["model.projector.layers.bias"] = (H,)
    W, G = s.sam_width, s.sam_image_size // s.sam_patch
    sam = "model.sam_model."
    t[sam + "patch_embed.proj.weight"] = (W, 3, s.sam_patch, s.sam_patch)
    t[sam + "patch_embed.proj.bias"] = (W,)
    t[sam + "pos_embed"] = (1, G, G, W)
    d = W // s.sam_heads
    for b in range(s.sam_layers):
        p = f"{sam}blocks.{b}."
        for n in ("norm1", "norm2"):
            t[p + n + ".weight"] = (W,)
            t[p + n + ".bias"] = (W,)
        t[p + "attn.qkv.weight"] = (3 * W, W)
        t[p + "attn.qkv.bias"] = (3 * W,)
        t[p + "attn.proj.weight"] = (W, W)
        t[p + "attn.proj.bias"] = (W,)
        rel = 2 * G - 1 if b in s.sam_global_blocks else 2 * s.sam_window - 1
        t[p + "attn.rel_pos_h"] = (rel, d)
        t[p + "attn.rel_pos_w"] = (rel, d)
        t[p + "mlp.lin1.weight"] = (s.sam_mlp_dim, W)
        t[p + "mlp.lin1.bias"] = (s.sam_mlp_dim,)
        t[p + "mlp.lin2.weight"] = (W, s.sam_mlp_dim)
        t[p + "mlp.lin2.bias"] = (W,)
    nk = s.sam_neck_dim
    t[sam + "neck.0.weight"] = (nk, W, 1, 1)
    t[sam + "neck.2.weight"] = (nk, nk, 3, 3)
    for n in ("neck.1", "neck.3"):
        t[sam + n + ".weight"] = (nk,)
        t[sam + n + ".bias"] = (nk,)
    c1, c2 = s.sam_downsample
    t[sam + "net_2.weight"] = (c1, nk, 3, 3)
    t[sam + "net_3.weight"] = (c2, c1, 3, 3)
    C, g = s.clip_width, s.clip_image_size // s.clip_patch
    vm = "model.vision_model."
    t[vm + "embeddings.class_embedding"] = (C,)
    t[vm + "embeddings.patch_embedding.weight"] = (C, 3, s.clip_patch, s.clip_patch)
    t[vm + "embeddings.position_embedding.weight"] = (g * g + 1, C)
    t[vm + "pre_layrnorm.weight"] = (C,)
    t[vm + "pre_layrnorm.bias"] = (C,)
    for c in range(s.clip_layers):
        p = f"{vm}transformer.layers.{c}."
        for n in ("layer_norm1", "layer_norm2"):
            t[p + n + ".weight"] = (C,)
            t[p + n + ".bias"] = (C,)
        t[p + "self_attn.qkv_proj.weight"] = (3 * C, C)
        t[p + "self_attn.qkv_proj.bias"] = (3 * C,)
        t[p + "self_attn.out_proj.weight"] = (C, C)
        t[p + "self_attn.out_proj.bias"] = (C,)
        t[p + "mlp.fc1.weight"] = (s.clip_mlp_dim, C)
        t[p + "mlp.fc1.bias"] = (s.clip_mlp_dim,)
        t[p + "mlp.fc2.weight"] = (C, s.clip_mlp_dim)
        t[p + "mlp.fc2.bias"] = (C,)
    return t


@pytest.mark.parametrize("spec", [ModelSpec(), tiny_spec()], ids=["full", "tiny"])
def test_names_and_shapes_match_facts(spec):
    got = expected_shapes(spec)
    want = facts_table(spec)
    assert sorted(set(want) - set(got)) == []
    assert sorted(set(got) - set(want)) == []
    assert {k: v for k, v in got.items() if want[k] != v} == {}


def test_full_spec_counts_on_meta():
    with torch.device("meta"):
        model = DeepseekOCRForCausalLM(ModelSpec())
    params = dict(model.named_parameters())
    assert len(params) == 2710
    assert list(model.buffers()) == []  # nothing in the state dict beyond the checkpoint's tensors
    assert sum(p.numel() for p in params.values()) == 3_336_106_240

    def part(prefix):
        return sum(p.numel() for n, p in params.items() if n.startswith(prefix))

    assert part("model.sam_model.") == 95_569_152
    assert part("model.vision_model.") == 303_177_728
    assert part("model.vision_model.embeddings.patch_embedding.") == 602_112
    assert part("model.projector.") == 2_622_720
    lm = part("model.layers.") + part("model.embed_tokens.") + part("model.norm.") + part("lm_head.")
    assert lm == 2_934_734_080
    experts = sum(p.numel() for n, p in params.items() if ".mlp.experts." in n)
    assert experts == 2_422_210_560


def test_module_paths_follow_contract():
    model = meta_model(ModelSpec())
    mods = dict(model.named_modules())
    for path in ["model.sam_model.patch_embed.proj", "model.sam_model.blocks.2.attn", "model.sam_model.neck.1",
                 "model.sam_model.net_3", "model.vision_model.embeddings", "model.vision_model.pre_layrnorm",
                 "model.vision_model.transformer.layers.23.self_attn.qkv_proj", "model.projector.layers",
                 "model.embed_tokens", "model.layers.0.mlp.gate_proj", "model.layers.1.mlp.gate",
                 "model.layers.11.mlp.experts.63", "model.layers.5.mlp.shared_experts", "model.norm", "lm_head"]:
        assert path in mods, path
    assert isinstance(mods["model.sam_model.blocks.0.norm1"], torch.nn.LayerNorm)
    assert mods["model.sam_model.blocks.0.norm1"].eps == 1e-6
    assert mods["model.vision_model.pre_layrnorm"].eps == 1e-5
