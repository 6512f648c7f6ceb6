"""Language-model rows for ONE forward call: prefill (the whole prompt) or one decode step.

Inputs broadcast over sweep points: `b` batch rows, `sq` new tokens per row, `n` tokens already cached per row,
`img` image slots per row (scattered into the embeddings, prefill only), `logit_rows` positions that get logits.
FLOPs follow docs/model-contract.md exactly (tensor_flops = what FlopCounterMode counts); attention is also
given causally (`tensor_flops_causal`). Byte model as in vision.py: each kernel reads inputs and writes outputs once
in the activation dtype; each norm/activation/add is one read + one write. Eager attention materialises the score
matrix: QK^T writes it (dt), the causal-mask add reads and writes it, softmax in fp32 reads it and writes fp32, the
cast back reads fp32 and writes dt, PV reads it: (6*dt + 8) bytes per score. SDPA/flash never write scores.
KV cache: static, updated in place: a call writes its new keys/values and reads the entries cached before it.
"""
from __future__ import annotations

import numpy as np

from ..spec import ModelSpec
from .cost import Cost
from .vision import SOFTMAX_FLOPS

RMS_FLOPS = 4  # RMSNorm per element: square, mean, normalise, weight
SILU_GATE_FLOPS = 6  # SiLU (x * sigmoid(x), ~5) plus the gating multiply, per inner element
ROPE_FLOPS = 3  # per rotated element: x*cos + rotate_half(x)*sin
SOFTMAX_ROUTER_FLOPS = 5  # router softmax per logit
TOPK_FLOPS = 1  # top-k selection, about one compare per logit
FP32 = 4


def expected_experts(n_experts: int, k: int, tokens):
    """Expected number of distinct experts B tokens touch when each picks k of E uniformly: E*(1-(1-k/E)^B)."""
    return n_experts * (1.0 - np.power(1.0 - k / n_experts, tokens))


def rms_norm(tokens, h: int, dt: int) -> Cost:
    el = tokens * h
    return Cost(other_flops=RMS_FLOPS * el,  # RMSNorm arithmetic (fp32)
                weight_bytes=h * dt, act_read=el * dt, act_write=el * dt,  # weight, input, output
                peak_activation=el * (2 * dt + FP32),  # input, output and the fp32 working copy
                weight_memory=h * dt)


def swiglu(tokens, h: int, inner: int, dt: int, weight_bytes, weight_memory, residual: bool) -> Cost:
    """down(silu(gate(x)) * up(x)) on `tokens` tokens, optionally with the block's residual add."""
    tensor = 3 * 2 * tokens * h * inner  # gate, up and down projections
    add = tokens * h if residual else 0.0  # residual add elements
    return Cost(tensor_flops=tensor, tensor_flops_causal=tensor,
                other_flops=SILU_GATE_FLOPS * tokens * inner + add,  # SiLU, gating multiply, residual add
                weight_bytes=weight_bytes,
                act_read=(tokens * (2 * h + 3 * inner + inner)  # gate/up read x, SiLU reads gate, mul reads 2, down reads 1
                          + 2 * add) * dt,  # residual reads both operands
                act_write=(tokens * (2 * inner + 2 * inner + h)  # gate, up, SiLU, product, down output
                           + add) * dt,  # residual sum
                peak_activation=tokens * (2 * h + 3 * inner) * dt,  # x, gate, up, SiLU output, output
                weight_memory=weight_memory)


def lm_rows(spec: ModelSpec, b, sq, n, img, logit_rows, attn: str, dt: int, params: dict,
            stage: str) -> list[tuple[str, str, tuple[str, ...], Cost]]:
    """Every LM row of one call: (stage, kind, module paths, per-module cost)."""
    s = spec
    h, heads, layers = s.hidden_size, s.num_attention_heads, s.num_hidden_layers
    t = b * sq  # query tokens in the call
    sk = n + sq  # keys each row attends to
    scores = b * heads * sq * sk  # attention score elements (non-causal count)
    causal_pairs = b * (sq * n + sq * (sq + 1) / 2)  # (query, key) pairs a causal mask keeps, per head
    rows = []

    emb = params["model.embed_tokens"]
    rows.append((stage, "lm.embed_tokens", ("model.embed_tokens",), Cost(
        weight_bytes=t * h * dt,  # one embedding row gathered per token
        act_read=t * 8 + b * img * h * dt,  # int64 ids, image features scattered in
        act_write=t * h * dt + b * img * h * dt,  # embeddings, scatter writes
        peak_activation=(2 * t * h + b * img * h) * dt,
        weight_memory=emb * dt)))

    lp = lambda name: tuple(f"model.layers.{i}.{name}" for i in range(layers))  # noqa: E731
    rows.append((stage, "lm.input_layernorm", lp("input_layernorm"), rms_norm(t, h, dt)))

    proj = 4 * 2 * t * h * h  # q, k, v, o projections
    eager = attn == "eager"
    rows.append((stage, "lm.self_attn", lp("self_attn"), Cost(
        tensor_flops=proj + 4 * b * sq * sk * h,  # + QK^T and PV over all S_q x S_kv (FlopCounterMode convention)
        tensor_flops_causal=proj + 4 * causal_pairs * h,  # + QK^T and PV over the causal triangle only
        other_flops=(2 * ROPE_FLOPS * t * h  # RoPE on q and k
                     + SOFTMAX_FLOPS * scores  # softmax with scale (and mask) per score
                     + t * h),  # residual add
        weight_bytes=4 * h * h * dt,
        act_read=(3 * t * h  # q/k/v projections read x
                  + 2 * t * h  # RoPE reads q, k
                  + 3 * t * h  # attention reads q and the new k, v
                  + t * h  # o_proj reads the attention output
                  + 2 * t * h) * dt  # residual add reads both operands
                 + (scores * (3 * dt + FP32) if eager else 0.0),  # eager: mask add, softmax, cast back, PV read scores
        act_write=(3 * t * h  # q, k, v
                   + 2 * t * h  # rotated q, k
                   + t * h  # attention output
                   + t * h  # o_proj output
                   + t * h) * dt  # residual sum
                  + (scores * (3 * dt + FP32) if eager else 0.0),  # eager: QK^T, mask add, fp32 softmax, cast back
        kv_read=b * n * 2 * h * dt,  # cached keys and values of earlier calls
        kv_write=t * 2 * h * dt,  # this call's keys and values into the cache
        peak_activation=5 * t * h * dt  # residual input, q, k, v, attention output
                        + (scores * (dt + FP32) if eager else 0.0),  # eager: dt scores and fp32 probabilities
        kv_memory=b * sk * 2 * h * dt,  # this layer's cache after the call
        weight_memory=4 * h * h * dt)))
    rows.append((stage, "lm.post_attention_layernorm", lp("post_attention_layernorm"), rms_norm(t, h, dt)))

    dense = list(range(min(s.first_k_dense_replace, layers)))
    if dense:
        w = 3 * h * s.intermediate_size * dt
        rows.append((stage, "lm.mlp.dense", tuple(f"model.layers.{i}.mlp" for i in dense),
                     swiglu(t, h, s.intermediate_size, dt, w, w, residual=True)))

    moe = s.moe_layers
    if moe:
        e, k = s.n_routed_experts, s.num_experts_per_tok
        mp = lambda name: tuple(f"model.layers.{i}.mlp.{name}" for i in moe)  # noqa: E731
        rows.append((stage, "lm.mlp.gate", mp("gate"), Cost(
            tensor_flops=2 * t * h * e, tensor_flops_causal=2 * t * h * e,  # router logits x @ W^T (fp32)
            other_flops=(SOFTMAX_ROUTER_FLOPS + TOPK_FLOPS) * t * e,  # softmax and top-k over the logits
            weight_bytes=e * h * dt,
            act_read=t * h * (dt + FP32) + 2 * t * e * FP32,  # x, its fp32 copy; softmax and top-k read fp32
            act_write=t * h * FP32 + 2 * t * e * FP32 + t * k * (FP32 + 8),  # fp32 x, logits, probs, top-k w + ids
            peak_activation=t * h * (dt + FP32) + 2 * t * e * FP32 + t * k * (FP32 + 8),
            weight_memory=e * h * dt)))
        one = 3 * h * s.moe_intermediate_size * dt  # bytes of one expert
        routed = swiglu(t * k, h, s.moe_intermediate_size, dt,
                        expected_experts(e, k, t) * one,  # distinct experts the call's tokens touch
                        e * one, residual=False)
        routed.other_flops = routed.other_flops + 2 * t * k * h + t * h  # weight and sum k outputs, residual add
        routed.act_read = routed.act_read + (t * h  # dispatch reads x
                                             + t * k * h  # combine reads the expert outputs
                                             + 2 * t * h) * dt  # residual add
        routed.act_write = routed.act_write + (t * k * h  # tokens gathered per expert
                                               + t * h  # combined output
                                               + t * h) * dt  # residual sum
        # experts run one after another on their own tokens: alive are x, the gathered copies and expert outputs,
        # the combined output, and one expert's SwiGLU intermediates at the average load t*k/E
        routed.peak_activation = (2 * t * h + 2 * t * k * h + t * k / e * (3 * s.moe_intermediate_size + h)) * dt
        rows.append((stage, "lm.mlp.experts", mp("experts"), routed))
        if s.n_shared_experts:
            w = 3 * h * s.shared_intermediate_size * dt
            shared = swiglu(t, h, s.shared_intermediate_size, dt, w, w, residual=False)
            shared.other_flops = shared.other_flops + t * h  # add to the routed output
            shared.act_read = shared.act_read + 2 * t * h * dt
            shared.act_write = shared.act_write + t * h * dt
            rows.append((stage, "lm.mlp.shared_experts", mp("shared_experts"), shared))

    rows.append((stage, "lm.norm", ("model.norm",), rms_norm(t, h, dt)))
    v = s.vocab_size
    head = 2 * logit_rows * h * v  # lm_head on the positions that get logits
    rows.append((stage, "lm.lm_head", ("lm_head",), Cost(
        tensor_flops=head, tensor_flops_causal=head,
        weight_bytes=v * h * dt,
        act_read=logit_rows * h * dt + logit_rows * v * dt,  # hidden states, dt logits for the fp32 cast
        act_write=logit_rows * v * (dt + FP32),  # dt logits, fp32 logits
        peak_activation=logit_rows * (h * dt + v * (dt + FP32)),  # input, dt and fp32 logits
        weight_memory=v * h * dt)))
    return rows
