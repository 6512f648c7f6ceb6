"""DeepSeek-OCR 2's second vision stage: a Qwen2-shaped decoder stack used as an encoder ("DeepEncoder V2").

SAM's map [N, C, h, w] becomes n = h*w visual tokens (raster order); the n learnable queries of that view size
(`query_768` for 12x12 maps, `query_1024` for 16x16) are appended, and the 2n tokens run through the layers with an
additive mask: visual tokens see every visual token (not the queries), query i sees every visual token and
queries 0..i. Positions 0..2n-1, 1-D RoPE (transformers' default when none are passed; assumed, the vendor does
not state them). The final norm is applied and the n query outputs are kept.

Module paths equal the checkpoint's: `model.qwen2_model` holds the query tables and `.model.model` the stack
(layers with q/k/v bias and no o bias, GQA, SwiGLU, RMSNorm). Attention is SDPA with the mask as `attn_mask` (the
vendor forces sdpa); keys and values are expanded to the query heads first.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..spec_v2 import OCR2Spec
from .decoder import MLP, RMSNorm, rope_cos_sin, rotate_half


def encoder_mask(n: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Additive [1, 1, 2n, 2n] mask: 0 where a token may attend, the dtype's minimum where it may not
    (paper eq. 1: [[1_nxn, 0], [1_nxn, LowerTri(n)]])."""
    allowed = torch.zeros(2 * n, 2 * n, dtype=torch.bool, device=device)
    allowed[:, :n] = True  # everyone sees the visual tokens
    allowed[n:, n:] = torch.ones(n, n, dtype=torch.bool, device=device).tril()  # queries: causal among themselves
    mask = torch.zeros(2 * n, 2 * n, dtype=dtype, device=device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[None, None]


class EncoderAttention(nn.Module):
    def __init__(self, spec: OCR2Spec):
        super().__init__()
        h, d = spec.enc_hidden, spec.enc_head_dim
        self.heads, self.kv_heads, self.head_dim = spec.enc_heads, spec.enc_kv_heads, d
        self.q_proj = nn.Linear(h, h, bias=True)
        self.k_proj = nn.Linear(h, self.kv_heads * d, bias=True)
        self.v_proj = nn.Linear(h, self.kv_heads * d, bias=True)
        self.o_proj = nn.Linear(h, h, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, hidden = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # GQA: kv head j serves group j
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, hidden))


class EncoderLayer(nn.Module):
    def __init__(self, spec: OCR2Spec):
        super().__init__()
        self.input_layernorm = RMSNorm(spec.enc_hidden, spec.enc_rms_eps)
        self.self_attn = EncoderAttention(spec)
        self.post_attention_layernorm = RMSNorm(spec.enc_hidden, spec.enc_rms_eps)
        self.mlp = MLP(spec.enc_hidden, spec.enc_intermediate)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class EncoderStack(nn.Module):
    """`model.qwen2_model.model.model`: the layers and the final norm (no token embedding)."""

    def __init__(self, spec: OCR2Spec):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(spec) for _ in range(spec.enc_layers))
        self.norm = RMSNorm(spec.enc_hidden, spec.enc_rms_eps)


class _Holder(nn.Module):
    """`model.qwen2_model.model`: only the path level the checkpoint has (the vendor's wrapper class)."""

    def __init__(self, spec: OCR2Spec):
        super().__init__()
        self.model = EncoderStack(spec)


class QueryEncoder(nn.Module):
    """`model.qwen2_model`: SAM map [N, C, h, w] -> query outputs [N, h*w, C]."""

    def __init__(self, spec: OCR2Spec):
        super().__init__()
        self.spec = spec
        self.model = _Holder(spec)
        for side in spec.query_views:
            self.add_module(f"query_{side}", nn.Embedding(spec.queries(side), spec.enc_hidden))

    def queries(self, n: int) -> torch.Tensor:
        for side in self.spec.query_views:
            if self.spec.queries(side) == n:
                return getattr(self, f"query_{side}").weight
        sides = ", ".join(f"{s} px ({self.spec.queries(s)} tokens)" for s in self.spec.query_views)
        raise ValueError(f"no query table for a view of {n} visual tokens; the encoder takes views of {sides}")

    def forward(self, sam: torch.Tensor) -> torch.Tensor:
        visual = sam.flatten(2).transpose(1, 2)  # [N, n, C] in raster order
        nviews, n, _ = visual.shape
        q = self.queries(n)
        x = torch.cat([visual, q.to(visual.dtype)[None].expand(nviews, -1, -1)], dim=1)
        mask = encoder_mask(n, x.dtype, x.device)
        positions = torch.arange(2 * n, device=x.device)
        cos, sin = rope_cos_sin(positions, self.spec.enc_head_dim, self.spec.enc_rope_theta, x.dtype)
        stack = self.model.model
        for layer in stack.layers:
            x = layer(x, cos, sin, mask)
        return stack.norm(x)[:, n:]
