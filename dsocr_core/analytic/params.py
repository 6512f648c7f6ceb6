"""Parameter counts per module of our torch model, from a ModelSpec alone.

Keys are the module paths of `DeepseekOCRForCausalLM.named_modules()` at the granularity of the analytic rows
(docs/model-contract.md), so weight memory joins on the same keys as FLOPs. Rows never overlap: the sum over all
keys is the model's parameter count.
"""
from __future__ import annotations

from functools import lru_cache

from ..registry import family_of
from ..spec import DecoderSpec as ModelSpec


def _linear(n_in: int, n_out: int, bias: bool) -> int:
    return n_in * n_out + (n_out if bias else 0)  # weight [out, in] (+ bias [out])


def sam_block_params(spec: ModelSpec, global_block: bool) -> dict[str, int]:
    """One SAM block: norms, attention (with its relative-position tables), MLP."""
    w, d = spec.sam_width, spec.sam_width // spec.sam_heads
    side = spec.sam_pos_grid if global_block else spec.sam_window  # rel_pos covers 2*side-1 offsets
    return {
        "norm1": 2 * w,  # LayerNorm weight + bias
        "attn": _linear(w, 3 * w, True) + _linear(w, w, True) + 2 * (2 * side - 1) * d,  # qkv, proj, rel_pos_h/w
        "norm2": 2 * w,
        "mlp": _linear(w, spec.sam_mlp_dim, True) + _linear(spec.sam_mlp_dim, w, True),  # lin1, lin2
    }


def clip_layer_params(spec: ModelSpec) -> dict[str, int]:
    c = spec.clip_width
    return {
        "layer_norm1": 2 * c,
        "self_attn": _linear(c, 3 * c, True) + _linear(c, c, True),  # qkv_proj, out_proj
        "layer_norm2": 2 * c,
        "mlp": _linear(c, spec.clip_mlp_dim, True) + _linear(spec.clip_mlp_dim, c, True),  # fc1, fc2
    }


def swiglu_params(hidden: int, inner: int) -> int:
    return 3 * hidden * inner  # gate_proj, up_proj, down_proj, no bias


@lru_cache(maxsize=64)
def _param_counts(spec: ModelSpec) -> tuple[tuple[str, int], ...]:
    s = spec
    out: dict[str, int] = {}
    # --- SAM ---
    out["model.sam_model.patch_embed"] = s.sam_width * 3 * s.sam_patch ** 2 + s.sam_width  # conv weight + bias
    out["model.sam_model.pos_embed"] = s.sam_pos_grid ** 2 * s.sam_width  # absolute positions [1, G, G, W]
    for b in range(s.sam_layers):
        for name, n in sam_block_params(s, b in s.sam_global_blocks).items():
            out[f"model.sam_model.blocks.{b}.{name}"] = n
    nd = s.sam_neck_dim
    out["model.sam_model.neck"] = s.sam_width * nd + 2 * nd + nd * nd * 9 + 2 * nd  # 1x1 conv, LN2d, 3x3 conv, LN2d
    out["model.sam_model.net_2"] = s.sam_downsample[0] * nd * 9  # 3x3 conv, no bias
    out["model.sam_model.net_3"] = s.sam_downsample[1] * s.sam_downsample[0] * 9
    # --- the family's vision stages after SAM (CLIP or the encoder), projector, layout vectors ---
    out.update(family_of(s).load("analytic").head_params(s))
    # --- language model ---
    h = s.hidden_size
    out["model.embed_tokens"] = s.vocab_size * h
    for i in range(s.num_hidden_layers):
        p = f"model.layers.{i}"
        out[f"{p}.input_layernorm"] = h
        out[f"{p}.self_attn"] = 4 * h * h  # q, k, v, o without bias
        out[f"{p}.post_attention_layernorm"] = h
        if i < s.first_k_dense_replace:
            out[f"{p}.mlp"] = swiglu_params(h, s.intermediate_size)
        else:
            out[f"{p}.mlp.gate"] = s.n_routed_experts * h  # router weight [E, H]
            out[f"{p}.mlp.experts"] = s.n_routed_experts * swiglu_params(h, s.moe_intermediate_size)
            if s.n_shared_experts:
                out[f"{p}.mlp.shared_experts"] = swiglu_params(h, s.shared_intermediate_size)
    out["model.norm"] = h
    out["lm_head"] = s.vocab_size * h  # untied
    return tuple(out.items())


def param_counts(spec: ModelSpec) -> dict[str, int]:
    """Parameters per analytic row key; keys never overlap, so the values sum to the total."""
    return dict(_param_counts(spec))


def stage_of(path: str, spec: ModelSpec | None = None) -> str:
    """The stage whose modules own a parameter path (weights of the LM serve prefill and decode)."""
    if path.startswith("model.sam_model"):
        return "sam"
    for prefix, stage in family_of_path(path, spec).items():
        if path.startswith(prefix):
            return stage
    return "lm"


def family_of_path(path: str, spec: ModelSpec | None) -> dict[str, str]:
    """Module-path prefixes of the vision stages after SAM, of the spec's family (default: every family's)."""
    from ..registry import FAMILIES

    fams = [family_of(spec)] if spec is not None else list(FAMILIES.values())
    return {k: v for fam in fams for k, v in fam.load("analytic").STAGE_PREFIXES.items()}


def stage_params(spec: ModelSpec) -> dict[str, int]:
    """Parameters per stage: the family's vision stages (projector incl. newline/separator), lm."""
    out = dict.fromkeys((*family_of(spec).vision_stages, "lm"), 0)
    for path, n in _param_counts(spec):
        out[stage_of(path, spec)] += n
    return out


def total_params(spec: ModelSpec) -> int:
    return sum(n for _, n in _param_counts(spec))


def activated_params(spec: ModelSpec) -> int:
    """Non-embedding parameters one decoded token touches (top-k experts, shared, gates, norms, attention,
    dense layers) plus lm_head. Embedding and vision excluded (574,127,360 for the official checkpoint, the
    paper's A570M)."""
    s, h = spec, spec.hidden_size
    per_layer = 2 * h + 4 * h * h  # two RMSNorms, q/k/v/o
    dense = s.first_k_dense_replace * swiglu_params(h, s.intermediate_size)
    moe = len(s.moe_layers) * (s.n_routed_experts * h  # router
                               + s.num_experts_per_tok * swiglu_params(h, s.moe_intermediate_size)  # top-k experts
                               + (swiglu_params(h, s.shared_intermediate_size) if s.n_shared_experts else 0))
    return s.num_hidden_layers * per_layer + dense + moe + h + s.vocab_size * h  # + final norm + lm_head


def param_breakdown(spec: ModelSpec) -> dict[str, int]:
    """Parameters per group, the groups the official checkpoint's 3,336,106,240 are counted in: embed, lm_head,
    attention, dense_mlp, routed_experts, shared_experts, gates, norms, the vision stages (sam, clip or encoder,
    projector), layout."""
    vision = family_of(spec).vision_stages
    groups = dict.fromkeys(["embed", "lm_head", "attention", "dense_mlp", "routed_experts", "shared_experts",
                            "gates", "norms", *vision, "layout"], 0)
    for path, n in _param_counts(spec):
        stage = stage_of(path, spec)
        if stage in vision and stage != "projector":
            key = stage
        elif path == "model.projector":
            key = "projector"
        elif path in ("model.image_newline", "model.view_seperator"):
            key = "layout"
        elif path == "model.embed_tokens":
            key = "embed"
        elif path == "lm_head":
            key = "lm_head"
        elif path.endswith("self_attn"):
            key = "attention"
        elif path.endswith(("layernorm", "model.norm")):
            key = "norms"
        elif path.endswith("mlp.gate"):
            key = "gates"
        elif path.endswith("mlp.experts"):
            key = "routed_experts"
        elif path.endswith("shared_experts"):
            key = "shared_experts"
        else:
            key = "dense_mlp"
        groups[key] += n
    return groups
