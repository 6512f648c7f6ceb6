"""Kernel plans of DeepSeek-OCR 2's encoder rows (analytic/encoder_v2.py), in the reference session mode.

The encoder is our eager torch model (dsocr_core/model/encoder_v2.py) over the L = 2n tokens of each view group
(the global views in one call, the crops of all images in another). Per layer: q, k and v projections (three
GEMMs with bias), RoPE on q and k, keys and values expanded to the query heads, SDPA with the additive [L, L]
mask, o_proj, residual; the SwiGLU MLP as the decoder's (gate and up GEMMs, silu, product, down GEMM). SDPA with
a float mask runs a kernel that reads the mask and computes every score: it is timed on the profile's
`attention.sdpa_bias` table, the masked-SDPA microbenchmark SAM's relative-position bias already needs, at
(batch x heads, L, L, head dim); no new kernel kind. The dense work is what it prices (encoder_v2's
`tensor_flops`); the mask's live 63% is reported beside it, never used to shorten the time.

The fast engine runs DeepSeek-OCR only (registry `fast_engine`); predict.py refuses a fast-mode prediction of
this model before any plan is asked for. Launch counts follow the code; nothing is fitted to measured times.
"""
from __future__ import annotations

import numpy as np

from .encoder_v2 import visual_tokens
from .kernels import BROADCAST, ROPE_OPS, Call, Kernel, Plan, eager_ops, eager_rms_norm, eager_rope
from .vision import SOFTMAX_FLOPS

# per layer's attention besides its GEMMs and SDPA: RoPE on q and k (10: two products with cos / sin, neg and cat of
# the halves, the add, on each), k and v expanded to the query heads (2 copies of a broadcast view), and 4 more (the
# head merge copy, the residual add, and the q/k/v views' setup), 16 in all (tests/test_reference_plan_ops.py holds
# the encoder stage's total to the model's); RoPE and the expansion run on the non-vectorised kernels of eager ops
# with a broadcast or strided operand (kernels.py BROADCAST)
ATTN_REST_OPS, EXPAND_OPS = 16, 2
MLP_REST_OPS = 3  # silu, product, residual add
INPUT_OPS = 16  # features flattened, [visual ; queries] concatenated, the mask (8 ops), RoPE tables (6)


def plan_encoder(c: Call) -> Plan:
    """The kernels of one call of an `encoder.*` row over `c.views` views of side `c.side`."""
    s, v, calls, dt = c.spec, c.views, c.calls, c.dt
    length, h = 2 * visual_tokens(s, c.side), s.enc_hidden
    m = v * length  # token rows of the call
    kind = c.kind
    if kind.startswith("encoder.queries."):  # the row of the other view size costs nothing in this call
        return Plan(rest_launches=np.where(np.asarray(c.cost.bytes) > 0, calls * INPUT_OPS, 0.0))
    if kind in ("encoder.input_layernorm", "encoder.post_attention_layernorm", "encoder.norm"):
        return eager_rms_norm(c, m * h, calls)  # the decoder's RMSNorm over every token row
    if kind == "encoder.self_attn":
        kv, heads, d = s.enc_kv_heads * s.enc_head_dim, s.enc_heads, s.enc_head_dim
        scores = heads * length * length
        return Plan([
            Kernel("gemm", dict(m=m, n=h, k=h), v * 2 * length * h * h,
                   v * 2 * length * h * dt + calls * (h * h + h) * dt, calls),  # q_proj
            Kernel("gemm", dict(m=m, n=kv, k=h), v * 4 * length * h * kv,
                   v * 2 * length * (h + kv) * dt + calls * 2 * (h * kv + kv) * dt, 2 * calls),  # k_proj, v_proj
            Kernel("attention.sdpa_bias", dict(bh=v * heads, q=length, k=length, d=d),
                   v * (4 * length * length * h + SOFTMAX_FLOPS * scores),
                   v * (4 * length * h + length * length) * dt, calls),  # masked SDPA over the expanded heads
            Kernel("gemm", dict(m=m, n=h, k=h), v * 2 * length * h * h,
                   v * 2 * length * h * dt + calls * h * h * dt, calls),  # o_proj (no bias)
            eager_rope(c, m * (h + kv), calls),  # RoPE on q and k (encoder_v2 counts it as lm.py does)
            eager_ops(BROADCAST, 2 * m * (kv + h) * dt, EXPAND_OPS * calls),  # k and v expanded to the heads
        ], rest_launches=calls * (ATTN_REST_OPS - ROPE_OPS - EXPAND_OPS))
    if kind == "encoder.mlp":
        inner = s.enc_intermediate
        return Plan([
            Kernel("gemm", dict(m=m, n=inner, k=h), v * 4 * length * h * inner,
                   2 * (v * length * h + calls * h * inner + v * length * inner) * dt, 2 * calls),  # gate, up
            Kernel("gemm", dict(m=m, n=h, k=inner), v * 2 * length * h * inner,
                   (v * length * inner + calls * inner * h + v * length * h) * dt, calls),  # down
        ], rest_launches=calls * MLP_REST_OPS)
    raise KeyError(kind)
