"""Vision stages for the fast engine: the reference modules' own weights and code, except SAM's attention (the
relative-position bias folded into q/k, attention.py), and no host synchronisation (crop grids and image-slot
positions are given as host values, read once before the stages run), so the stages can be captured in CUDA
graphs. Stages are split like the reference (sam, clip, projector) so each can be timed on its own.
"""
from __future__ import annotations

import torch

from ..model.sam import SamBlock, SamEncoder, window_partition, window_unpartition
from .attention import sam_attention


def sam_block(block: SamBlock, x: torch.Tensor, fold: bool = True) -> torch.Tensor:
    h = block.norm1(x)
    if block.window:
        size = h.shape[1:3]
        h, padded = window_partition(h, block.window)
        h = window_unpartition(sam_attention(block.attn, h, fold), block.window, padded, size)
    else:
        h = sam_attention(block.attn, h, fold)
    x = x + h
    return x + block.mlp(block.norm2(x))


def sam_forward(sam: SamEncoder, pixels: torch.Tensor, fold: bool = True) -> torch.Tensor:
    """SamEncoder.forward with folded attention: [N, 3, S, S] -> [N, C, S/64, S/64]."""
    pos = sam.pos_embed
    x = sam.patch_embed(pixels.to(device=pos.device, dtype=pos.dtype))
    x = x + sam._pos_embed(x.shape[1], x.shape[2])
    for block in sam.blocks:
        x = sam_block(block, x, fold)
    x = sam.neck(x.permute(0, 3, 1, 2))
    return sam.net_3(sam.net_2(x))


def view_list(images, grids: list[tuple[int, int]]) -> list[torch.Tensor]:
    """The views of every row in the reference order: global [1,3,S,S], then its crops when tiled."""
    views = []
    for row, ((crops, glob), (tw, th)) in enumerate(zip(images, grids)):
        views.append(glob if glob.dim() == 4 else glob[None])
        if (tw, th) != (1, 1):
            if crops is None or crops.shape[0] != tw * th:
                got = None if crops is None else tuple(crops.shape)
                raise ValueError(f"row {row}: grid {tw}x{th} needs {tw * th} crops, got {got}")
            views.append(crops)
    return views


def view_groups(views: list[torch.Tensor]) -> list[list[int]]:
    """Indices of views with the same size, in first-seen order (the reference's grouping)."""
    groups: dict[tuple, list[int]] = {}
    for i, v in enumerate(views):
        groups.setdefault(tuple(v.shape[1:]), []).append(i)
    return list(groups.values())


def run_sam(model, views: list[torch.Tensor], groups: list[list[int]], fold: bool = True) -> list[torch.Tensor]:
    sam = model.model.sam_model
    return [sam_forward(sam, torch.cat([views[i] for i in g]) if len(g) > 1 else views[g[0]], fold)
            for g in groups]


def run_clip(model, sams: list[torch.Tensor]) -> list[torch.Tensor]:
    return [model.model.vision_model(s) for s in sams]


def run_projector(model, views, groups, grids, sams, clips) -> list[torch.Tensor]:
    """Features of each group -> each row's image slots [slots, H] (reference layout)."""
    m = model.model
    feats = [m.project(c, s) for c, s in zip(clips, sams)]
    per_view: list[torch.Tensor | None] = [None] * len(views)
    for g, f in zip(groups, feats):
        for i, part in zip(g, f.split([views[i].shape[0] for i in g])):
            per_view[i] = part
    it = iter(per_view)
    rows = []
    for tw, th in grids:
        glob = next(it)[0]
        local = next(it) if (tw, th) != (1, 1) else None
        rows.append(m.layout_image(glob, local, (tw, th)))
    return rows


def embed_with_images(model, input_ids: torch.Tensor, slot_index: torch.Tensor | None,
                      image_rows: list[torch.Tensor] | None) -> torch.Tensor:
    """Token embeddings [B, T, H] with the image slots (flat row-major positions `slot_index`, the rows' slots
    in order) replaced by the image embeddings: the values the reference's masked_scatter writes."""
    x = model.model.embed_tokens(input_ids)
    if image_rows:
        b, t, h = x.shape
        x.view(b * t, h).index_copy_(0, slot_index, torch.cat(image_rows).to(x.dtype))
    return x
