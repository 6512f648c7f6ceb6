"""Vision stages for the fast engine: the reference modules' own weights and code, except SAM's attention (the
relative-position bias added inside FlexAttention or folded into q/k, attention.py), CLIP run over every view
group at once (packed rows), and no host synchronisation (crop grids and image-slot positions are given as host
values, read once before the stages run), so the stages can be captured in CUDA graphs. Stages are split like
the reference (sam, clip, projector) so each can be timed on its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ..model.clip import ClipLayer
from ..model.sam import SamBlock, SamEncoder, window_partition, window_unpartition
from .attention import sam_attention_t


def sam_block_fn(x, n1w, n1b, qkv_w, qkv_b, proj_w, proj_b, rel_h, rel_w, n2w, n2b, l1w, l1b, l2w, l2b,
                 window: int, heads: int, attn: str):
    """SamBlock.forward on plain tensors (pre-LN, windowed when window > 0, exact GELU MLP)."""
    h = F.layer_norm(x, (x.shape[-1],), n1w, n1b, 1e-6)
    if window:
        size = h.shape[1:3]
        h, padded = window_partition(h, window)
        h = window_unpartition(sam_attention_t(h, qkv_w, qkv_b, proj_w, proj_b, rel_h, rel_w, heads, attn),
                               window, padded, size)
    else:
        h = sam_attention_t(h, qkv_w, qkv_b, proj_w, proj_b, rel_h, rel_w, heads, attn)
    x = x + h
    h = F.layer_norm(x, (x.shape[-1],), n2w, n2b, 1e-6)
    return x + F.linear(F.gelu(F.linear(h, l1w, l1b)), l2w, l2b)


def sam_block_eager(*args):
    """sam_block_fn run eagerly, with the folded attention where FlexAttention was asked for (eager flex
    materialises every score): what a SAM block falls back to when compiling it fails."""
    *rest, attn = args
    return sam_block_fn(*rest, "fold" if attn == "flex" else attn)


def sam_block_args(block: SamBlock) -> tuple:
    a = block.attn
    return (block.norm1.weight, block.norm1.bias, a.qkv.weight, a.qkv.bias, a.proj.weight, a.proj.bias,
            a.rel_pos_h, a.rel_pos_w, block.norm2.weight, block.norm2.bias, block.mlp.lin1.weight,
            block.mlp.lin1.bias, block.mlp.lin2.weight, block.mlp.lin2.bias)


def clip_layer_fn(x, ln1w, ln1b, qkv_w, qkv_b, out_w, out_b, ln2w, ln2b, fc1w, fc1b, fc2w, fc2b, heads: int,
                  shapes: tuple[tuple[int, int], ...]):
    """ClipLayer.forward (pre-LN, SDPA without mask, quick_gelu MLP) on packed rows: x [R, C] holds the tokens
    of every view of every group, group after group; shapes ((views, tokens per view), ...). The row-wise work
    (norms, projections, MLP) runs once over all rows, so each weight is read once per layer rather than once per
    group and the GEMMs get more rows; attention runs per group."""
    c = x.shape[-1]
    h = F.layer_norm(x, (c,), ln1w, ln1b, 1e-5)
    qkv = F.linear(h, qkv_w, qkv_b)
    outs = []
    for part, (b, n) in zip(qkv.split([b * n for b, n in shapes]), shapes):
        q, k, v = part.reshape(b, n, 3, heads, c // heads).permute(2, 0, 3, 1, 4).unbind(0)
        outs.append(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b * n, c))
    x = x + F.linear(torch.cat(outs) if len(outs) > 1 else outs[0], out_w, out_b)
    h = F.linear(F.layer_norm(x, (c,), ln2w, ln2b, 1e-5), fc1w, fc1b)
    return x + F.linear(h * torch.sigmoid(1.702 * h), fc2w, fc2b)


def clip_layer_args(layer: ClipLayer) -> tuple:
    a, m = layer.self_attn, layer.mlp
    return (layer.layer_norm1.weight, layer.layer_norm1.bias, a.qkv_proj.weight, a.qkv_proj.bias,
            a.out_proj.weight, a.out_proj.bias, layer.layer_norm2.weight, layer.layer_norm2.bias,
            m.fc1.weight, m.fc1.bias, m.fc2.weight, m.fc2.bias)


def sam_block(block: SamBlock, x: torch.Tensor, attn: str = "fold", fn: Callable = sam_block_fn) -> torch.Tensor:
    return fn(x, *sam_block_args(block), block.window, block.attn.heads, attn)


class Positions(dict):
    """Position tables resized to a grid size, computed once per size: the reference resizes them (bicubic, in
    float32) in every forward, ~55 us per call on an H200. Keyed by (encoder, h, w); the weights never change
    under an engine."""

    def get_or_make(self, key: tuple, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        if key not in self:
            self[key] = make()
        return self[key]


def patch_embed(proj: torch.nn.Conv2d, pixels: torch.Tensor) -> torch.Tensor:
    """PatchEmbed as one GEMM: [N, 3, S, S] -> [N, S/p, S/p, W]. A p x p conv with stride p multiplies each
    patch's 3*p*p pixels by the flattened kernel; cuDNN runs this 3-channel conv on a non-tensor-core kernel
    (0.35 ms per call on an H200), the GEMM on tensor cores. Same sums, in another order."""
    w = proj.weight  # [W, 3, p, p]
    p = w.shape[-1]
    n, c, s, s2 = pixels.shape
    patches = pixels.reshape(n, c, s // p, p, s2 // p, p).permute(0, 2, 4, 1, 3, 5).reshape(n, s // p, s2 // p, -1)
    return F.linear(patches, w.reshape(w.shape[0], -1), proj.bias)


def sam_forward(sam: SamEncoder, pixels: torch.Tensor, attn: str = "fold", block_fn: Callable = sam_block_fn,
                positions: Positions | None = None) -> torch.Tensor:
    """SamEncoder.forward with attention `attn` (attention.SAM_ATTENTION): [N, 3, S, S] -> [N, C, S/64, S/64].
    `block_fn` may be a compiled sam_block_fn; `positions` caches the resized position table."""
    pos = sam.pos_embed
    x = patch_embed(sam.patch_embed.proj, pixels.to(device=pos.device, dtype=pos.dtype))
    h, w = x.shape[1:3]
    positions = positions if positions is not None else Positions()  # (an empty cache is falsy)
    x = x + positions.get_or_make(("sam", h, w), lambda: sam._pos_embed(h, w))
    for block in sam.blocks:
        x = sam_block(block, x, attn, block_fn)
    x = sam.neck(x.permute(0, 3, 1, 2))
    return sam.net_3(sam.net_2(x))


def view_groups(views: list[torch.Tensor]) -> list[list[int]]:
    """Indices of views with the same size, in first-seen order (the reference's grouping)."""
    groups: dict[tuple, list[int]] = {}
    for i, v in enumerate(views):
        groups.setdefault(tuple(v.shape[1:]), []).append(i)
    return list(groups.values())


def run_sam(model, views: list[torch.Tensor], groups: list[list[int]], attn: str = "fold",
            block_fn: Callable = sam_block_fn, positions: Positions | None = None) -> list[torch.Tensor]:
    sam = model.model.sam_model
    return [sam_forward(sam, torch.cat([views[i] for i in g]) if len(g) > 1 else views[g[0]], attn, block_fn,
                        positions) for g in groups]


def run_clip(model, sams: list[torch.Tensor], layer_fn: Callable = clip_layer_fn, packed: bool = True,
             positions: Positions | None = None) -> list[torch.Tensor]:
    """ClipEncoder.forward of each group's SAM features [N, C, g, g] -> [N, 1 + g*g, C], each layer through
    `layer_fn`. packed: all groups' rows go through every layer together (one layer call per layer);
    otherwise one group at a time, as the reference runs them."""
    clip = model.model.vision_model
    heads = clip.transformer.layers[0].self_attn.heads
    positions = positions if positions is not None else Positions()
    embedded = [clip.pre_layrnorm(clip.embeddings(s, positions.get_or_make(
        ("clip", *s.shape[2:]), lambda s=s: clip.embeddings._positions(*s.shape[2:])))) for s in sams]  # [N, n, C]
    batches = [embedded] if packed else [[e] for e in embedded]
    out = []
    for part in batches:
        shapes = tuple((e.shape[0], e.shape[1]) for e in part)
        x = torch.cat([e.reshape(-1, e.shape[-1]) for e in part])
        for layer in clip.transformer.layers:
            x = layer_fn(x, *clip_layer_args(layer), heads, shapes)
        out += [y.view(b, n, -1) for y, (b, n) in zip(x.split([b * n for b, n in shapes]), shapes)]
    return out


@dataclass
class SlotLayout:
    """Where the projector's output goes, for one input shape. The projected rows of every view group and the two
    layout vectors (newline, separator) sit end to end in one source buffer: group g's rows at
    `segments[g]` = (first row, rows), then the newline, then the separator. `source_index[j]` is the source row of
    image slot j, the slots of every row laid end to end in the order the reference's layout_image writes them."""

    segments: list[tuple[int, int]]
    source_index: torch.Tensor
    rows: int  # projected rows of all groups (the newline is source row `rows`, the separator `rows + 1`)

    @property
    def count(self) -> int:
        return int(self.source_index.numel())

    def to(self, device) -> "SlotLayout":
        return SlotLayout(self.segments, self.source_index.to(device), self.rows)

    def source(self, model, like: torch.Tensor) -> torch.Tensor:
        """A source buffer [rows + 2, H] (dtype and device of `like`) holding the layout vectors in its last two
        rows; the projector writes the features into the rest. Written once: an engine's weights never change."""
        m = model.model
        src = like.new_empty(self.rows + 2, m.image_newline.shape[-1])
        src[self.rows] = m.image_newline.to(src.dtype)
        src[self.rows + 1] = m.view_seperator.to(src.dtype)
        return src


def slot_sources(views: list[torch.Tensor], groups: list[list[int]], grids: list[tuple[int, int]],
                 px: int) -> SlotLayout:
    """The SlotLayout of one input shape, computed on the host once (`px`: pixels per feature side); the rows'
    slot counts are checked against images_seq_mask before (prefill.check_slots). Per row
    (DeepSeekOCRModel.layout_image): the crops stitched into one (th*t) x (tw*t) map with a newline after every
    map row, then the global g x g grid with a newline after every row, then the separator."""
    per_view: list[torch.Tensor | None] = [None] * len(views)  # each view's feature rows -> their slots
    newlines, separators, base = [], [], 0
    order = iter(range(len(views)))
    for tw, th in grids:
        glob = next(order)
        if views[glob].shape[0] != 1:
            raise ValueError(f"a row's global view must be one view, got {tuple(views[glob].shape)}")
        if (tw, th) != (1, 1):
            local = next(order)
            if views[local].shape[0] != tw * th:
                raise ValueError(f"grid {tw}x{th} needs {tw * th} crops, got {tuple(views[local].shape)}")
            t = views[local].shape[-1] // px
            tile = torch.arange(tw * th * t * t).div(t * t, rounding_mode="floor")
            inner = torch.arange(t * t).repeat(tw * th)
            width = tw * t + 1  # a stitched map row and its newline
            per_view[local] = base + ((tile // tw) * t + inner // t) * width + (tile % tw) * t + inner % t
            newlines.append(base + torch.arange(th * t) * width + tw * t)
            base += th * t * width
        g = views[glob].shape[-1] // px
        j = torch.arange(g * g)
        per_view[glob] = base + (j // g) * (g + 1) + j % g
        newlines.append(base + torch.arange(g) * (g + 1) + g)
        base += g * (g + 1)
        separators.append(torch.tensor([base]))
        base += 1
    source = torch.full((base,), -1, dtype=torch.long)
    segments, start = [], 0
    for grp in groups:
        slots = torch.cat([per_view[i] for i in grp])
        source[slots] = torch.arange(start, start + slots.numel())
        segments.append((start, int(slots.numel())))
        start += int(slots.numel())
    source[torch.cat(newlines)] = start
    source[torch.cat(separators)] = start + 1
    if int(source.min()) < 0:
        raise ValueError("slot_sources left an image slot without a source row")
    return SlotLayout(segments, source, start)


def run_projector(model, groups: list[list[int]], sams, clips, layout: SlotLayout,
                  source: torch.Tensor) -> torch.Tensor:
    """Features of each group -> every row's image slots, end to end [slots, H] (the reference's layout). Each
    group's projector GEMM writes its rows into `source` (layout.source), and one gather lays out every slot,
    where the reference lays out each image with a Python loop of cats (two to four kernels per image). Inference
    only (under no_grad, as the engine's prefill runs): addmm's out= takes no autograd."""
    m = model.model
    linear = m.projector.layers
    for (start, n), c, s in zip(layout.segments, clips, sams):
        x = m.projector_input(c, s)
        torch.addmm(linear.bias, x.reshape(n, -1), linear.weight.t(), out=source[start:start + n])  # = linear(x)
    return source.index_select(0, layout.source_index)


def run_projector_per_image(model, views, groups, grids, sams, clips) -> list[torch.Tensor]:
    """The engine option projector_layout='per_image' (how every run before that option existed laid images
    out): the reference's layout_image per image, each row's slots [slots, H] on its own."""
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
                      image_slots: torch.Tensor | list[torch.Tensor] | None) -> torch.Tensor:
    """Token embeddings [B, T, H] with the image slots (flat row-major positions `slot_index`, the rows' slots
    in order: run_projector's output, or run_projector_per_image's rows) replaced by the image embeddings: the
    values the reference's masked_scatter writes."""
    x = model.model.embed_tokens(input_ids)
    if image_slots is not None and len(image_slots):
        image_slots = torch.cat(image_slots) if isinstance(image_slots, list) else image_slots
        b, t, h = x.shape
        x.view(b * t, h).index_copy_(0, slot_index, image_slots.to(x.dtype))
    return x
