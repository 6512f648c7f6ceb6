"""SAM ViT-B image encoder with the DeepSeek-OCR neck and 4x compressor (official weights: width 768, 12 blocks
of 12 heads, global attention in blocks 2, 5, 8, 11, 14x14 windows elsewhere).

Pixels [N,3,S,S] -> patches [N,P,P,W] (P = S/16) -> 12 pre-LN blocks (14x14 windows, except the global blocks)
-> neck (1x1 conv, LayerNorm2d, 3x3 conv, LayerNorm2d) -> net_2, net_3 (stride-2 convs) -> [N, C_out, P/4, P/4].
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..spec import ModelSpec


def resize_grid_fp32(grid: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Resize a [1, C, h, w] map bicubic (antialias, align_corners False) in float32, cast back."""
    out = F.interpolate(grid.float(), size=size, mode="bicubic", align_corners=False, antialias=True)
    return out.to(grid.dtype)


class LayerNorm2d(nn.Module):
    """LayerNorm over the channel dim of a [N, C, H, W] map (weight/bias per channel)."""

    def __init__(self, channels: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(1, keepdim=True)
        var = (x - mean).pow(2).mean(1, keepdim=True)
        x = (x - mean) / torch.sqrt(var + self.eps)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


class PatchEmbed(nn.Module):
    def __init__(self, width: int, patch: int):
        super().__init__()
        self.proj = nn.Conv2d(3, width, kernel_size=patch, stride=patch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).permute(0, 2, 3, 1)  # [N, P, P, W] channels last, like SAM


def rel_pos_table(rel_pos: torch.Tensor, q_size: int, k_size: int) -> torch.Tensor:
    """Relative-position embeddings for every (query, key) pair along one axis: [q_size, k_size, d].

    The learned table has 2*size-1 rows; for another size it is resized linearly in float32."""
    length = 2 * max(q_size, k_size) - 1
    if rel_pos.shape[0] != length:
        table = F.interpolate(rel_pos.float().t()[None], size=length, mode="linear", align_corners=False)
        rel_pos = table[0].t().to(rel_pos.dtype)
    # scale coordinates when q and k differ in size (never in DeepSeek-OCR, kept for generality)
    q_coords = torch.arange(q_size, device=rel_pos.device)[:, None] * max(k_size / q_size, 1.0)
    k_coords = torch.arange(k_size, device=rel_pos.device)[None, :] * max(q_size / k_size, 1.0)
    index = (q_coords - k_coords) + (k_size - 1) * max(q_size / k_size, 1.0)
    return rel_pos[index.long()]


class SamAttention(nn.Module):
    """Multi-head attention with decomposed relative positions, run through SDPA with a dense bias."""

    def __init__(self, width: int, heads: int, rel_size: int):
        super().__init__()
        self.heads = heads
        self.head_dim = width // heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.rel_pos_h = nn.Parameter(torch.zeros(2 * rel_size - 1, self.head_dim))
        self.rel_pos_w = nn.Parameter(torch.zeros(2 * rel_size - 1, self.head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, c = x.shape  # b = views * windows
        n, d = h * w, self.head_dim
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, d).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # [b, heads, n, d]
        bias = self._rel_bias(q.reshape(b * self.heads, h, w, d), h, w)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.view(b, self.heads, n, n))
        return self.proj(out.transpose(1, 2).reshape(b, h, w, c))

    def _rel_bias(self, q: torch.Tensor, h: int, w: int) -> torch.Tensor:
        """Dense [b*heads, h*w, h*w] bias = rel_h (per key row) + rel_w (per key column), SAM style."""
        rh = rel_pos_table(self.rel_pos_h, h, h).to(q.dtype)  # [h, h, d]
        rw = rel_pos_table(self.rel_pos_w, w, w).to(q.dtype)  # [w, w, d]
        rel_h = torch.einsum("bhwc,hkc->bhwk", q, rh)  # [bh, h, w, h]
        rel_w = torch.einsum("bhwc,wkc->bhwk", q, rw)  # [bh, h, w, w]
        bias = rel_h[:, :, :, :, None] + rel_w[:, :, :, None, :]  # [bh, h, w, h, w]
        return bias.reshape(q.shape[0], h * w, h * w)


class SamMLP(nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.lin1 = nn.Linear(width, hidden)
        self.lin2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin2(F.gelu(self.lin1(x)))  # exact (erf) GELU


def window_partition(x: torch.Tensor, window: int) -> tuple[torch.Tensor, tuple[int, int]]:
    """[N, H, W, C] -> [N * nw, window, window, C], zero-padding H and W up to multiples of window."""
    n, h, w, c = x.shape
    pad_h, pad_w = (window - h % window) % window, (window - w % window) % window
    if pad_h or pad_w:
        x = F.pad(x, (0, 0, 0, pad_w, 0, pad_h))
    hp, wp = h + pad_h, w + pad_w
    x = x.view(n, hp // window, window, wp // window, window, c)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, window, window, c), (hp, wp)


def window_unpartition(x: torch.Tensor, window: int, padded: tuple[int, int], size: tuple[int, int]) -> torch.Tensor:
    """Inverse of window_partition, cropping the padding away."""
    (hp, wp), (h, w) = padded, size
    n = x.shape[0] // ((hp // window) * (wp // window))
    x = x.view(n, hp // window, wp // window, window, window, -1)
    x = x.permute(0, 1, 3, 2, 4, 5).reshape(n, hp, wp, -1)
    return x[:, :h, :w, :].contiguous()


class SamBlock(nn.Module):
    """Pre-LN transformer block; window > 0 means windowed attention, 0 means global."""

    def __init__(self, spec: ModelSpec, window: int):
        super().__init__()
        w = spec.sam_width
        self.window = window
        self.norm1 = nn.LayerNorm(w, eps=1e-6)
        self.attn = SamAttention(w, spec.sam_heads, window if window else spec.sam_pos_grid)
        self.norm2 = nn.LayerNorm(w, eps=1e-6)
        self.mlp = SamMLP(w, spec.sam_mlp_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        if self.window:
            size = h.shape[1:3]
            h, padded = window_partition(h, self.window)
            h = window_unpartition(self.attn(h), self.window, padded, size)
        else:
            h = self.attn(h)
        x = x + h
        return x + self.mlp(self.norm2(x))


class SamEncoder(nn.Module):
    """`model.sam_model`: [N, 3, S, S] pixels -> [N, sam_downsample[1], S/64, S/64]."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        w, g, neck = spec.sam_width, spec.sam_pos_grid, spec.sam_neck_dim
        self.patch_embed = PatchEmbed(w, spec.sam_patch)
        self.pos_embed = nn.Parameter(torch.zeros(1, g, g, w))
        self.blocks = nn.ModuleList(
            SamBlock(spec, 0 if b in spec.sam_global_blocks else spec.sam_window) for b in range(spec.sam_layers)
        )
        self.neck = nn.Sequential(
            nn.Conv2d(w, neck, kernel_size=1, bias=False),
            LayerNorm2d(neck),
            nn.Conv2d(neck, neck, kernel_size=3, padding=1, bias=False),
            LayerNorm2d(neck),
        )
        c1, c2 = spec.sam_downsample
        self.net_2 = nn.Conv2d(neck, c1, kernel_size=3, stride=2, padding=1, bias=False)
        self.net_3 = nn.Conv2d(c1, c2, kernel_size=3, stride=2, padding=1, bias=False)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        pos = self.pos_embed
        x = self.patch_embed(pixels.to(device=pos.device, dtype=pos.dtype))  # [N, P, P, W]; no-op when matching
        x = x + self._pos_embed(x.shape[1], x.shape[2])
        for block in self.blocks:
            x = block(x)
        x = self.neck(x.permute(0, 3, 1, 2))  # [N, neck, P, P]
        return self.net_3(self.net_2(x))

    def _pos_embed(self, h: int, w: int) -> torch.Tensor:
        pos = self.pos_embed
        if pos.shape[1:3] == (h, w):
            return pos
        return resize_grid_fp32(pos.permute(0, 3, 1, 2), (h, w)).permute(0, 2, 3, 1)
