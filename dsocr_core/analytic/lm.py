"""Language-model rows for ONE forward call: prefill (the whole prompt) or one decode step.

Inputs broadcast over sweep points: `b` batch rows, `sq` new tokens per row, `n` tokens already cached per row,
`img` image slots per row (scattered into the embeddings, prefill only), `logit_rows` positions that get logits.
FLOPs follow docs/model-contract.md exactly (tensor_flops = what FlopCounterMode counts); attention is also given
causally (`tensor_flops_causal`).

Byte model: the ops of our eager torch model (dsocr_core/model/decoder.py), each reading its inputs and writing its
output once: RMSNorm in fp32 is six ops (2*dt + 16 bytes read, 2*dt + 12 written per element), RoPE five, the MoE
gathers tokens per expert, scatters expert outputs back and combines them in fp32. Eager attention materialises
the scores: QK^T writes them (dt), the scale and (prefill) the causal masked_fill read and write them, `.float()`,
fp32 softmax and the cast back move 4-byte copies, PV reads them. SDPA/flash never write scores.
KV cache: preallocated, updated in place: a call writes its new keys/values and reads the entries cached before
it (our reference KVCache concatenates instead, which also rewrites the whole cache every step).
"""
from __future__ import annotations

import numpy as np

from ..spec import ModelSpec
from .cost import Cost
from .vision import SOFTMAX_FLOPS

RMS_FLOPS = 4  # RMSNorm per element: square, mean, normalise, weight
SILU_GATE_FLOPS = 6  # SiLU (x * sigmoid(x), ~5) plus the gating multiply, per inner element
ROPE_FLOPS = 3.5  # per rotated element: x*cos, negate half, rotate_half(x)*sin, add
SOFTMAX_ROUTER_FLOPS = 5  # router softmax per logit
TOPK_FLOPS = 1  # top-k selection, about one compare per logit
FP32 = 4
INT64 = 8


def expected_experts(n_experts: int, k: int, tokens):
    """Expected number of distinct experts B tokens touch when each picks k of E uniformly: E*(1-(1-k/E)^B)."""
    return n_experts * (1.0 - np.power(1.0 - k / n_experts, tokens))


def rms_norm(tokens, h: int, dt: int) -> Cost:
    """x.float(), pow, mean, * rsqrt, .to(dt), * weight: six ops over tokens x h."""
    el = tokens * h
    return Cost(other_flops=RMS_FLOPS * el,  # RMSNorm arithmetic (fp32)
                weight_bytes=h * dt,
                act_read=el * (2 * dt + 4 * FP32),  # x, fp32 x, its square, fp32 x again, normalised, cast
                act_write=el * (2 * dt + 3 * FP32),  # fp32 x, square, normalised, cast, scaled output
                peak_activation=el * (dt + 2 * FP32),  # input, fp32 copy, its square
                weight_memory=h * dt)


def swiglu(tokens, h: int, inner: int, dt: int, weight_bytes, weight_memory) -> Cost:
    """down(silu(gate(x)) * up(x)) on `tokens` tokens: five kernels."""
    tensor = 3 * 2 * tokens * h * inner  # gate, up and down projections
    return Cost(tensor_flops=tensor, tensor_flops_causal=tensor,
                other_flops=SILU_GATE_FLOPS * tokens * inner,  # SiLU and the gating multiply
                weight_bytes=weight_bytes,
                act_read=tokens * (2 * h + inner + 2 * inner + inner) * dt,  # gate/up read x, SiLU, mul, down
                act_write=tokens * (2 * inner + inner + inner + h) * dt,  # gate, up, SiLU, product, down output
                peak_activation=tokens * (2 * h + 3 * inner) * dt,  # x, gate, up, SiLU output, output
                weight_memory=weight_memory)


def _add(c: Cost, tokens, h: int, dt: int) -> Cost:
    """Charge one elementwise add of two [tokens, h] tensors (a residual or the shared-expert sum) to c."""
    c.other_flops = c.other_flops + tokens * h  # one add per element
    c.act_read = c.act_read + 2 * tokens * h * dt  # both operands
    c.act_write = c.act_write + tokens * h * dt  # the sum
    return c


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

    scatter = np.where(np.asarray(img) > 0, 1.0, 0.0)  # prefill with images: masked_scatter per row, then stack
    rows.append((stage, "lm.embed_tokens", ("model.embed_tokens",), Cost(
        weight_bytes=t * h * dt,  # one embedding row gathered per token
        act_read=t * INT64 + scatter * (t * h + b * img * h + t * h) * dt,  # ids; scatter reads x and images; stack
        act_write=t * h * dt + scatter * 2 * t * h * dt,  # embeddings; scattered rows; stacked batch
        peak_activation=(t * h + scatter * (2 * t * h + b * img * h)) * dt,
        weight_memory=params["model.embed_tokens"] * dt)))

    lp = lambda name: tuple(f"model.layers.{i}.{name}" for i in range(layers))  # noqa: E731
    rows.append((stage, "lm.input_layernorm", lp("input_layernorm"), rms_norm(t, h, dt)))

    proj = 4 * 2 * t * h * h  # q, k, v, o projections
    if attn == "eager":
        masked = np.where(np.asarray(sq) > 1, 1.0, 0.0)  # the causal masked_fill runs only when S_q > 1
        score_read = scores * ((3 + masked) * dt + 2 * FP32)  # scale, mask, .float(), softmax, cast, PV reads
        score_write = scores * ((3 + masked) * dt + 2 * FP32)  # QK^T, scale, mask, .float(), softmax, cast
        score_peak = scores * (dt + 2 * FP32)  # dt scores, fp32 copy and fp32 probabilities alive at softmax
    else:
        score_read = score_write = score_peak = 0.0  # SDPA / flash keep scores on chip
    attn_cost = Cost(
        tensor_flops=proj + 4 * b * sq * sk * h,  # + QK^T and PV over all S_q x S_kv (FlopCounterMode convention)
        tensor_flops_causal=proj + 4 * causal_pairs * h,  # + QK^T and PV over the causal triangle only
        other_flops=(2 * ROPE_FLOPS * t * h  # RoPE on q and k
                     + SOFTMAX_FLOPS * scores),  # softmax with scale (and mask) per score
        weight_bytes=4 * h * h * dt,
        act_read=(3 * t * h  # q/k/v projections read x
                  + 2 * 5.5 * t * h  # RoPE on q and k: x*cos, negate, cat, *sin, add read 5.5 per element
                  + 3 * t * h  # attention reads q and the new k, v
                  + t * h  # head merge (transpose + reshape copy)
                  + t * h) * dt  # o_proj reads the merged heads
                 + score_read,
        act_write=(3 * t * h  # q, k, v
                   + 2 * 4.5 * t * h  # RoPE writes 4.5 per element
                   + t * h  # attention output
                   + t * h  # merged heads
                   + t * h) * dt  # o_proj output
                  + score_write,
        kv_read=b * n * 2 * h * dt,  # cached keys and values of earlier calls
        kv_write=t * 2 * h * dt,  # this call's keys and values into the cache
        peak_activation=8 * t * h * dt + score_peak,  # residual, normed x, q, k, v, RoPE temporaries, output
        kv_memory=b * sk * 2 * h * dt,  # this layer's cache after the call
        weight_memory=4 * h * h * dt)
    rows.append((stage, "lm.self_attn", lp("self_attn"), _add(attn_cost, t, h, dt)))  # + residual add
    rows.append((stage, "lm.post_attention_layernorm", lp("post_attention_layernorm"), rms_norm(t, h, dt)))

    dense = list(range(min(s.first_k_dense_replace, layers)))
    if dense:
        w = 3 * h * s.intermediate_size * dt
        rows.append((stage, "lm.mlp.dense", tuple(f"model.layers.{i}.mlp" for i in dense),
                     _add(swiglu(t, h, s.intermediate_size, dt, w, w), t, h, dt)))  # + residual add

    moe = s.moe_layers
    if moe:
        e, k = s.n_routed_experts, s.num_experts_per_tok
        tk = t * k  # (token, expert) pairs
        mp = lambda name: tuple(f"model.layers.{i}.mlp.{name}" for i in moe)  # noqa: E731
        rows.append((stage, "lm.mlp.gate", mp("gate"), Cost(
            tensor_flops=2 * t * h * e, tensor_flops_causal=2 * t * h * e,  # router logits x @ W^T (fp32)
            other_flops=(SOFTMAX_ROUTER_FLOPS + TOPK_FLOPS) * t * e + tk,  # softmax, top-k, scaling the weights
            weight_bytes=e * h * dt,  # W, cast to fp32 on every call
            act_read=(t * h * (dt + FP32) + e * h * FP32  # x, its fp32 copy and fp32 W into the matmul
                      + 2 * t * e * FP32 + tk * FP32),  # softmax and top-k read fp32, scaling reads weights
            act_write=(t * h * FP32 + e * h * FP32  # fp32 x, fp32 W
                       + 2 * t * e * FP32 + tk * (FP32 + INT64) + tk * FP32),  # logits, probs, top-k, scaled
            peak_activation=t * h * (dt + FP32) + e * h * FP32 + 2 * t * e * FP32 + tk * (2 * FP32 + INT64),
            weight_memory=e * h * dt)))
        one = 3 * h * s.moe_intermediate_size * dt  # bytes of one expert
        routed = swiglu(tk, h, s.moe_intermediate_size, dt,
                        expected_experts(e, k, t) * one,  # distinct experts the call's tokens touch
                        e * one)  # every expert is resident
        routed.other_flops = routed.other_flops + 2 * tk * h  # weight and sum the k outputs (fp32)
        routed.act_read = routed.act_read + (
            tk * INT64 * 3  # argsort, bincount and index math over the flat expert ids
            + tk * h * dt  # each expert gathers its tokens: x[token[rows]]
            + tk * h * dt  # scatter of expert outputs into their (token, slot) rows
            + tk * h * dt + tk * h * FP32 + tk * h * FP32 + t * h * FP32)  # .float(), * weights, sum, .to(dt)
        routed.act_write = routed.act_write + (
            tk * INT64 * 3
            + tk * h * dt  # gathered tokens
            + tk * h * dt  # out[(token, slot)] rows
            + tk * h * FP32 + tk * h * FP32 + t * h * FP32 + t * h * dt)  # fp32 copy, weighted, sum, cast back
        # experts run one after another: alive are x, the per-slot outputs with their two fp32 copies while they
        # are combined, and the largest SwiGLU intermediates, one expert at the average load t*k/E tokens
        routed.peak_activation = (t * h * dt + tk * h * (dt + 2 * FP32)
                                  + tk / e * (2 * h + 3 * s.moe_intermediate_size) * dt)
        rows.append((stage, "lm.mlp.experts", mp("experts"), _add(routed, t, h, dt)))  # + the layer's residual add
        if s.n_shared_experts:
            w = 3 * h * s.shared_intermediate_size * dt
            shared = swiglu(t, h, s.shared_intermediate_size, dt, w, w)
            rows.append((stage, "lm.mlp.shared_experts", mp("shared_experts"), _add(shared, t, h, dt)))  # y + shared

    rows.append((stage, "lm.norm", ("model.norm",), rms_norm(t, h, dt)))
    v = s.vocab_size
    head = 2 * logit_rows * h * v  # lm_head on the positions that get logits
    cast = dt < FP32  # .float() copies the logits to float32; on float32 logits it is the tensor itself
    rows.append((stage, "lm.lm_head", ("lm_head",), Cost(
        tensor_flops=head, tensor_flops_causal=head,
        weight_bytes=v * h * dt,
        act_read=logit_rows * h * dt + cast * logit_rows * v * dt,  # hidden states; dt logits read by .float()
        act_write=logit_rows * v * (dt + cast * FP32),  # dt logits, fp32 logits
        peak_activation=logit_rows * (h * dt + v * (dt + cast * FP32)),  # input, dt and fp32 logits
        weight_memory=v * h * dt)))
    return rows
