"""The language model's math for the fast engine, as plain functions over tensors (no modules), so the same
code runs eagerly on the CPU, inside CUDA-graph captures, and under torch.compile.

Every op follows the reference decoder (model/decoder.py): RMSNorm in float32 cast back before the weight,
rotate-half RoPE with cos/sin from the same `rope_cos_sin`, causal attention, SwiGLU, fp32 router. Differences
are of layout only: q/k/v in one matmul, gate/up in one matmul, experts grouped (moe.py), KV written into a
static cache, logits for the last position only.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..model.decoder import rotate_half
from ..spec import ModelSpec
from .attention import decode_attention
from .moe import moe_forward, swiglu


@dataclass(frozen=True)
class LMConfig:
    hidden: int
    heads: int
    head_dim: int
    eps: float
    inter: int  # dense MLP inner width
    moe_inter: int  # one expert's inner width
    k: int  # experts per token
    n_routed: int
    shared_slots: int
    norm_topk_prob: bool
    scale: float

    @classmethod
    def from_spec(cls, spec: ModelSpec, shared_slots: int) -> "LMConfig":
        return cls(spec.hidden_size, spec.num_attention_heads, spec.head_dim, spec.rms_norm_eps,
                   spec.intermediate_size, spec.moe_intermediate_size, spec.num_experts_per_tok,
                   spec.n_routed_experts, shared_slots, spec.norm_topk_prob, spec.routed_scaling_factor)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The reference RMSNorm: float32 statistics, cast back, then times the weight."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + rotate_half(x) * sin


def mlp(h: torch.Tensor, lw, cfg: LMConfig, moe_impl: str, gemv: str) -> torch.Tensor:
    """Dense SwiGLU or MoE of one layer on tokens h [T, H] -> [T, H]."""
    if lw.gate is None:
        return F.linear(swiglu(F.linear(h, lw.w13), cfg.inter), lw.w2)
    return moe_forward(h, lw.gate, lw.w13, lw.w2, k=cfg.k, n_routed=cfg.n_routed, shared_slots=cfg.shared_slots,
                       inner=cfg.moe_inter, norm_topk_prob=cfg.norm_topk_prob, scale=cfg.scale, impl=moe_impl,
                       gemv=gemv)


def prefill_layer(x: torch.Tensor, lw, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor,
                  values: torch.Tensor, cfg: LMConfig) -> torch.Tensor:
    """One decoder layer over a whole prompt x [B, T, H] (positions 0..T-1, empty cache before it); writes the
    layer's keys/values into `keys`/`values` ([B, heads, T, d] views of the static cache)."""
    b, t, hdim = x.shape
    h = rms_norm(x, lw.ln1, cfg.eps)
    q, k, v = F.linear(h, lw.wqkv).view(b, t, 3, cfg.heads, cfg.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    q, k = rope(q, cos, sin), rope(k, cos, sin)  # [B, heads, T, d]
    keys.copy_(k)
    values.copy_(v)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + F.linear(o.transpose(1, 2).reshape(b, t, hdim), lw.wo)
    h = rms_norm(x, lw.ln2, cfg.eps)
    return x + mlp(h.view(b * t, hdim), lw, cfg, "grouped", "linear").view(b, t, hdim)


def make_decode_fns(cfg: LMConfig, attention: str, moe_impl: str, gemv: str) -> dict:
    """The pieces of one decode step (batch B, one token per row), each a function of tensors only:

    embed(token [B], table) -> x [B, H]
    dense(x, keys, values, pos, cos_t, sin_t, ln1, wqkv, wo, ln2, w13, w2) -> x
    moe(x, keys, values, pos, cos_t, sin_t, ln1, wqkv, wo, ln2, w13, w2, gate) -> x
    final(x, norm, lm_head) -> float32 logits [B, V]

    keys/values are [B, heads, L, d] prefixes of the static cache with L > pos; the layer writes its new
    key/value at `pos` (long [1], on the device) and attends over slots 0..pos. cos_t/sin_t are the full RoPE
    tables [max_pos, d]; the rows for `pos` are gathered on the device. No host sync anywhere."""

    def embed(token, table):
        return F.embedding(token, table)

    def layer(x, keys, values, pos, cos_t, sin_t, ln1, wqkv, wo, ln2, w13, w2, gate):
        b = x.shape[0]
        h = rms_norm(x, ln1, cfg.eps)
        q, k, v = F.linear(h, wqkv).view(b, 3, cfg.heads, cfg.head_dim).unbind(1)  # [B, heads, d]
        cos, sin = cos_t[pos], sin_t[pos]  # [1, d]
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        keys.index_copy_(2, pos, k[:, :, None])
        values.index_copy_(2, pos, v[:, :, None])
        o = decode_attention(q, keys, values, pos, attention)
        x = x + F.linear(o.reshape(b, cfg.hidden), wo)
        h = rms_norm(x, ln2, cfg.eps)
        if gate is None:
            return x + F.linear(swiglu(F.linear(h, w13), cfg.inter), w2)
        return x + moe_forward(h, gate, w13, w2, k=cfg.k, n_routed=cfg.n_routed, shared_slots=cfg.shared_slots,
                               inner=cfg.moe_inter, norm_topk_prob=cfg.norm_topk_prob, scale=cfg.scale,
                               impl=moe_impl, gemv=gemv)

    def dense(x, keys, values, pos, cos_t, sin_t, ln1, wqkv, wo, ln2, w13, w2):
        return layer(x, keys, values, pos, cos_t, sin_t, ln1, wqkv, wo, ln2, w13, w2, None)

    def moe(x, keys, values, pos, cos_t, sin_t, ln1, wqkv, wo, ln2, w13, w2, gate):
        return layer(x, keys, values, pos, cos_t, sin_t, ln1, wqkv, wo, ln2, w13, w2, gate)

    def final(x, norm, lm_head):
        return F.linear(rms_norm(x, norm, cfg.eps), lm_head).float()

    return {"embed": embed, "dense": dense, "moe": moe, "final": final}
