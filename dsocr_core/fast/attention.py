"""Attention for the fast engine: one decode query against a static KV cache, and SAM's attention with the
decomposed relative-position bias folded into q/k so a flash kernel can run without a dense mask.

SAM fold (exact up to rounding). The reference adds bias(i, j) = rel_h[i, row(j)] + rel_w[i, col(j)] as a dense
[B, heads, N, N] mask (384 MiB per 1024^2 view), which rules out flash attention. Written as one dot product:

    scale * q_i . k_j + rel_h[i, row(j)] + rel_w[i, col(j)] = [scale*q_i, rel_h_i, rel_w_i] . [k_j, e_row(j), e_col(j)]

with e_r the one-hot vector of row r. So SDPA over q' = [scale*q, rel_h, rel_w], k' = [k, onehot rows, onehot
cols] (zero-padded to a multiple of 8) with scale 1.0 computes the same scores; v keeps its head dim (cuDNN's
flash kernel takes a value head dim different from the query's, so the PV product is not padded). For head dim
64 the scale is 1/8, a power of two, so scale*q is exact in bf16.

SAM flex (an option; its kernel measured 5x slower than the fold on an H200). FlexAttention adds the same two
bias terms inside its flash kernel, per score, from rel_h [b, heads, n, h] and rel_w [b, heads, n, w] (a few MB):
no folded copies of q/k, no larger head dim. Compiled (inside the compiled SAM block) it is one Triton kernel;
eagerly it materialises the scores (CPU tests).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

from ..model.sam import SamAttention, rel_pos_table


def decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, pos: torch.Tensor,
                     impl: str = "reduce") -> torch.Tensor:
    """One new query per row against cache slots 0..pos (later slots are masked out).

    q [B, heads, d]; keys/values [B, heads, L, d] (a prefix of the static cache, L > pos); pos long [1].
    impl 'reduce': explicit float32 multiply-sum and softmax (what Inductor turns into split reductions with
    good parallelism at batch 1); 'sdpa': scaled_dot_product_attention with a boolean mask (eager GPU path).
    Returns [B, heads, d] in q's dtype."""
    length = keys.shape[2]
    valid = torch.arange(length, device=keys.device) <= pos  # [L]
    if impl == "sdpa":
        out = F.scaled_dot_product_attention(q[:, :, None], keys, values, attn_mask=valid.view(1, 1, 1, length))
        return out[:, :, 0]
    if impl != "reduce":
        raise ValueError(f"decode attention impl must be 'reduce' or 'sdpa', got {impl!r}")
    scores = (q.float()[:, :, None, :] * keys.float()).sum(-1) * q.shape[-1] ** -0.5  # [B, heads, L]
    probs = torch.softmax(scores.masked_fill(~valid, float("-inf")), dim=-1)
    return (probs[..., None] * values.float()).sum(2).to(q.dtype)


def _round8(n: int) -> int:
    return (n + 7) // 8 * 8


SAM_ATTENTION = ("flex", "fold", "dense")


def sam_attention(attn: SamAttention, x: torch.Tensor, impl: str = "fold") -> torch.Tensor:
    """SamAttention.forward with the relative-position bias added inside FlexAttention ('flex'), folded into
    q/k ('fold') or as the reference's dense mask ('dense'). x [b, h, w, c] -> [b, h, w, c]."""
    return sam_attention_t(x, attn.qkv.weight, attn.qkv.bias, attn.proj.weight, attn.proj.bias, attn.rel_pos_h,
                           attn.rel_pos_w, attn.heads, impl)


def sam_attention_t(x: torch.Tensor, qkv_w, qkv_b, proj_w, proj_b, rel_pos_h, rel_pos_w, heads: int,
                    impl: str = "fold") -> torch.Tensor:
    """sam_attention on plain tensors (what the compiled SAM block calls)."""
    if impl not in SAM_ATTENTION:
        raise ValueError(f"SAM attention must be one of {SAM_ATTENTION}, got {impl!r}")
    b, h, w, c = x.shape
    n, d = h * w, c // heads
    q, k, v = F.linear(x, qkv_w, qkv_b).reshape(b, n, 3, heads, d).permute(2, 0, 3, 1, 4).unbind(0)
    rh = rel_pos_table(rel_pos_h, h, h).to(q.dtype)  # [h, h, d]
    rw = rel_pos_table(rel_pos_w, w, w).to(q.dtype)  # [w, w, d]
    qr = q.reshape(b * heads, h, w, d)
    rel_h = torch.einsum("bhwc,hkc->bhwk", qr, rh)  # the reference's two einsums
    rel_w = torch.einsum("bhwc,wkc->bhwk", qr, rw)
    if impl == "dense":  # the reference: dense [b*heads, n, n] bias as SDPA's mask
        bias = (rel_h[:, :, :, :, None] + rel_w[:, :, :, None, :]).reshape(b, heads, n, n)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    else:
        rel_h, rel_w = rel_h.reshape(b, heads, n, h), rel_w.reshape(b, heads, n, w)
        out = _flex_rel_pos(q, k, v, rel_h, rel_w, w) if impl == "flex" else _folded(q, k, v, rel_h, rel_w, h, w)
    return F.linear(out.transpose(1, 2).reshape(b, h, w, c), proj_w, proj_b)


def _flex_rel_pos(q, k, v, rel_h, rel_w, w: int) -> torch.Tensor:
    """Attention with bias(i, j) = rel_h[i, j // w] + rel_w[i, j % w] added to each scaled score in the kernel."""

    def add_rel_pos(score, b, head, i, j):
        return score + rel_h[b, head, i, j // w] + rel_w[b, head, i, j % w]

    return flex_attention(q, k, v, score_mod=add_rel_pos)


def _folded(q, k, v, rel_h, rel_w, h: int, w: int) -> torch.Tensor:
    """The fold described above: SDPA over [scale*q, rel_h, rel_w] . [k, onehot rows, onehot cols]."""
    b, heads, n, d = q.shape
    dim = _round8(d + h + w)
    pad = dim - (d + h + w)
    idx = torch.arange(n, device=q.device)  # key j sits at row j // w, column j % w
    onehot = torch.cat([(idx // w)[:, None] == torch.arange(h, device=q.device),
                        (idx % w)[:, None] == torch.arange(w, device=q.device)], -1).to(q.dtype)  # [n, h+w]
    qf = torch.cat([q * d ** -0.5, rel_h, rel_w], -1)
    kf = torch.cat([k, onehot.expand(b, heads, n, h + w)], -1)
    if pad:
        qf, kf = F.pad(qf, (0, pad)), F.pad(kf, (0, pad))
    return F.scaled_dot_product_attention(qf, kf, v, scale=1.0)  # v keeps head dim d: PV work is not padded
