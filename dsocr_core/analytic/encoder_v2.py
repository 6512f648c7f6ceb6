"""DeepSeek-OCR 2's vision rows: SAM (shared with DeepSeek-OCR; net_3 emits 896 channels), the Qwen2-shaped encoder
with learnable queries, the linear projector. The cost of ONE view of side S pixels, as plain numbers.

A view of S px gives n = (S/64)^2 visual tokens (1024 -> 256, 768 -> 144); the encoder runs on L = 2n tokens
([visual ; queries]) and keeps the n query outputs. Attention: 14 query heads over 2 key/value heads (GQA), RoPE,
an additive [L, L] mask (visual rows see the visual tokens, query i sees the visual tokens and queries 0..i) built
once per forward and read by SDPA in every layer. SDPA with an explicit mask computes every score, so the PRICED
work (`tensor_flops`, what FlopCounterMode counts) is the dense 4 * L^2 * hidden per layer; the live work, only
the mask's open entries (2n^2 + n(n+1)/2 of 4n^2, about 63%), is carried in `tensor_flops_causal`.

Byte model as in vision.py and lm.py: each op of our eager torch model (dsocr_core/model/encoder_v2.py) reads
its inputs and writes its output once in the activation dtype; RMSNorm in fp32 as the decoder's.
"""
from __future__ import annotations

from ..spec_v2 import OCR2Spec
from .cost import Cost
from .lm import ROPE_FLOPS, _add, rms_norm, swiglu
from .params import _linear
from .vision import SOFTMAX_FLOPS, sam_out_side, sam_rows

ENC = "model.qwen2_model.model.model"  # the encoder's decoder stack (checkpoint prefix)
# module-path prefixes of the stages after SAM (params.stage_of)
STAGE_PREFIXES = {"model.qwen2_model": "encoder", "model.projector": "projector", "model.view_seperator": "projector"}


def visual_tokens(spec: OCR2Spec, side: int) -> int:
    g = sam_out_side(spec, side)
    return g * g


def live_scores(n: int) -> int:
    """Open entries of the [2n, 2n] mask: visual rows see n visual tokens; query i sees n + i + 1 tokens."""
    return n * n + n * n + n * (n + 1) // 2


def layer_params(spec: OCR2Spec) -> dict[str, int]:
    h, kv = spec.enc_hidden, spec.enc_kv_heads * spec.enc_head_dim
    return {
        "input_layernorm": h,
        "self_attn": _linear(h, h, True) + 2 * _linear(h, kv, True) + _linear(h, h, False),  # q, k, v (bias), o
        "post_attention_layernorm": h,
        "mlp": 3 * h * spec.enc_intermediate,  # gate, up, down, no bias
    }


def head_params(spec: OCR2Spec) -> dict[str, int]:
    """Parameters of the stages after SAM: the encoder (layers, final norm, query tables), projector, separator."""
    out: dict[str, int] = {}
    for side in spec.query_views:
        out[f"model.qwen2_model.query_{side}"] = spec.queries(side) * spec.enc_hidden
    for i in range(spec.enc_layers):
        for name, n in layer_params(spec).items():
            out[f"{ENC}.layers.{i}.{name}"] = n
    out[f"{ENC}.norm"] = spec.enc_hidden
    out["model.projector"] = _linear(spec.enc_hidden, spec.hidden_size, True)
    out["model.view_seperator"] = spec.hidden_size
    return out


def encoder_inputs(spec: OCR2Spec, side: int, dt: int) -> Cost:
    """[visual ; queries] and the mask: the SAM map flattened (a view), the query table (weights) concatenated after
    it, the additive [L, L] mask written once per forward (its Python loop over queries not charged)."""
    n, h = visual_tokens(spec, side), spec.enc_hidden
    length = 2 * n
    return Cost(other_flops=length * length,  # filling the mask
                weight_bytes=n * h * dt,  # the view size's query table
                act_read=n * h * dt,  # SAM features
                act_write=(length * h + length * length) * dt,  # the sequence, the mask
                peak_activation=(n * h + length * h + length * length) * dt,
                weight_memory=n * h * dt)


def encoder_attn(spec: OCR2Spec, side: int, dt: int, params_n: int) -> Cost:
    """One encoder layer's attention on one view: q/k/v (bias) with GQA, RoPE on q and k, SDPA with the additive mask
    (keys and values expanded to the query heads), o_proj, residual add (charged here, as in lm.py)."""
    n, h = visual_tokens(spec, side), spec.enc_hidden
    length, kv = 2 * n, spec.enc_kv_heads * spec.enc_head_dim
    linear = 2 * length * h * (h + 2 * kv) + 2 * length * h * h  # q, k, v; o
    dense = 4 * length * length * h  # QK^T and PV over every score (what the masked SDPA kernel computes)
    live = 4 * live_scores(n) * h  # the same over the mask's open entries
    scores = spec.enc_heads * length * length
    rope = length * (h + kv)  # rotated elements of q and k
    cost = Cost(tensor_flops=linear + dense, tensor_flops_causal=linear + live,
                other_flops=(ROPE_FLOPS * rope  # RoPE on q and k
                             + scores  # mask add
                             + SOFTMAX_FLOPS * scores),  # softmax inside SDPA
                weight_bytes=params_n * dt,
                act_read=(3 * length * h  # q, k, v projections read x
                          + 5.5 * rope  # RoPE: x*cos, negate, cat, *sin, add read 5.5 per element (as lm.py)
                          + 2 * length * kv  # k and v expanded to the query heads read
                          + 3 * length * h + length * length  # SDPA reads q, expanded k, v and the mask
                          + length * h  # head merge
                          + length * h) * dt,  # o_proj reads the merged heads
                act_write=(length * (h + 2 * kv)  # q, k, v
                           + 4.5 * rope  # RoPE writes 4.5 per element
                           + 2 * length * h  # expanded k, v
                           + length * h  # SDPA output
                           + length * h  # merged heads
                           + length * h) * dt,  # o_proj output
                peak_activation=(length * h  # shortcut
                                 + length * (h + 2 * kv) + 2 * length * h  # q, k, v and the expanded k, v
                                 + length * length  # the mask
                                 + length * h) * dt,  # SDPA output
                weight_memory=params_n * dt)
    return _add(cost, length, h, dt)  # + residual add


def encoder_mlp(spec: OCR2Spec, side: int, dt: int, params_n: int) -> Cost:
    length, h = 2 * visual_tokens(spec, side), spec.enc_hidden
    return _add(swiglu(length, h, spec.enc_intermediate, dt, params_n * dt, params_n * dt), length, h, dt)


def projector(spec: OCR2Spec, side: int, dt: int, params_n: int) -> Cost:
    """Linear(enc_hidden -> hidden) on the n query outputs (the visual outputs are dropped)."""
    n, h, e = visual_tokens(spec, side), spec.hidden_size, spec.enc_hidden
    tensor = 2 * n * e * h
    return Cost(tensor_flops=tensor, tensor_flops_causal=tensor,
                weight_bytes=params_n * dt,
                act_read=n * e * dt, act_write=n * h * dt,
                peak_activation=n * (e + h) * dt,
                weight_memory=params_n * dt)


def view_rows(spec: OCR2Spec, side: int, dt: int, params: dict) -> list[tuple[str, str, tuple[str, ...], Cost]]:
    """Every vision row for one view of `side` pixels: (stage, kind, module paths, per-view cost). The query table
    row is per view size (query_768 for crops, query_1024 for the global view)."""
    rows = sam_rows(spec, side, dt, params)
    length, h = 2 * visual_tokens(spec, side), spec.enc_hidden
    rows.append(("encoder", f"encoder.queries.{side}", (f"model.qwen2_model.query_{side}",),
                 encoder_inputs(spec, side, dt)))
    n = layer_params(spec)
    paths = lambda name: tuple(f"{ENC}.layers.{i}.{name}" for i in range(spec.enc_layers))  # noqa: E731
    rows.append(("encoder", "encoder.input_layernorm", paths("input_layernorm"), rms_norm(length, h, dt)))
    rows.append(("encoder", "encoder.self_attn", paths("self_attn"), encoder_attn(spec, side, dt, n["self_attn"])))
    rows.append(("encoder", "encoder.post_attention_layernorm", paths("post_attention_layernorm"),
                 rms_norm(length, h, dt)))
    rows.append(("encoder", "encoder.mlp", paths("mlp"), encoder_mlp(spec, side, dt, n["mlp"])))
    rows.append(("encoder", "encoder.norm", (f"{ENC}.norm",), rms_norm(length, h, dt)))
    rows.append(("projector", "projector", ("model.projector",), projector(spec, side, dt, params["model.projector"])))
    return rows
