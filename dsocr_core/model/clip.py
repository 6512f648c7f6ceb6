"""CLIP-L/14 encoder fed by SAM features instead of its own patch conv (official weights: width 1024, 24 layers,
16 heads; the patch conv stays in the checkpoint, unused).

SAM output [N, C, g, g] -> tokens [N, g*g, C] -> CLS prepended, positions added (patch positions resized when
g != 16) -> pre_layrnorm -> pre-LN blocks (fused qkv, SDPA without mask, quick_gelu MLP) -> [N, 1 + g*g, C].
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..spec import ModelSpec
from .sam import resize_grid_fp32


class ClipEmbeddings(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        c, grid = spec.clip_width, spec.clip_pos_grid
        self.grid = grid
        self.class_embedding = nn.Parameter(torch.zeros(c))
        # in the checkpoint but never run: SAM features replace the patch conv's output
        self.patch_embedding = nn.Conv2d(3, c, kernel_size=spec.clip_patch, stride=spec.clip_patch, bias=False)
        self.position_embedding = nn.Embedding(grid * grid + 1, c)

    def forward(self, feats: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """`positions`: self._positions(h, w) computed beforehand (the fast engine caches it per grid size)."""
        n, c, h, w = feats.shape
        tokens = feats.flatten(2).transpose(1, 2)  # [N, h*w, C]
        cls = self.class_embedding.to(tokens.dtype).expand(n, 1, c)
        x = torch.cat([cls, tokens], dim=1)
        return x + (self._positions(h, w) if positions is None else positions).to(x.dtype)[None]

    def _positions(self, h: int, w: int) -> torch.Tensor:
        """[1 + h*w, C]: the CLS position as is, patch positions resized bicubic when the grid is not 16x16."""
        pos = self.position_embedding.weight
        if (h, w) == (self.grid, self.grid):
            return pos
        patch = pos[1:].reshape(1, self.grid, self.grid, -1).permute(0, 3, 1, 2)
        patch = resize_grid_fp32(patch, (h, w)).permute(0, 2, 3, 1).reshape(h * w, -1)
        return torch.cat([pos[:1], patch], dim=0)


class ClipAttention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv_proj = nn.Linear(width, 3 * width)
        self.out_proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv_proj(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v)  # [b, heads, n, d]
        return self.out_proj(out.transpose(1, 2).reshape(b, n, c))


class ClipMLP(nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        return self.fc2(h * torch.sigmoid(1.702 * h))  # quick_gelu


class ClipLayer(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        c = spec.clip_width
        self.layer_norm1 = nn.LayerNorm(c, eps=1e-5)
        self.self_attn = ClipAttention(c, spec.clip_heads)
        self.layer_norm2 = nn.LayerNorm(c, eps=1e-5)
        self.mlp = ClipMLP(c, spec.clip_mlp_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class ClipTransformer(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.layers = nn.ModuleList(ClipLayer(spec) for _ in range(spec.clip_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class ClipEncoder(nn.Module):
    """`model.vision_model`: SAM features [N, C, g, g] -> [N, 1 + g*g, C] (CLS first, no post-LN)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.embeddings = ClipEmbeddings(spec)
        self.pre_layrnorm = nn.LayerNorm(spec.clip_width, eps=1e-5)  # (sic) the checkpoint's spelling
        self.transformer = ClipTransformer(spec)

    def forward(self, sam_feats: torch.Tensor) -> torch.Tensor:
        return self.transformer(self.pre_layrnorm(self.embeddings(sam_feats)))
