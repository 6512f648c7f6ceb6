"""The fast engine's prefill: static input buffers and four stage runners (sam, clip, projector, LM) per input
shape, each captured as a CUDA graph on a GPU so every stage stays timeable on its own."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..model.deepseek_ocr import view_list
from .compiled import cudnn_benchmark
from .graphs import Captured
from .lm import rms_norm
from .vision import (embed_with_images, run_clip, run_projector, run_projector_per_image, run_sam, slot_sources,
                     view_groups)


def prefill_key(engine, inputs, t: int, logits: str) -> tuple[tuple, dict]:
    """The shape key of a prefill of the first `t` prompt tokens, and what it feeds: the views, their grids and
    the flat image-slot positions (one host sync)."""
    images = list(inputs.images) if inputs.images and t > 1 else []
    if not images:
        return (t, logits), {"views": [], "grids": [], "slots": None}
    grids = [tuple(int(v) for v in g) for g in inputs.images_spatial_crop.reshape(-1, 2).tolist()]
    views = view_list(images, grids)
    mask = inputs.images_seq_mask[:, :t]
    slots = mask.reshape(-1).nonzero()[:, 0]
    check_slots(mask, views, grids, 4 * engine.spec.sam_patch)
    key = (t, logits, tuple(grids), tuple(tuple(v.shape) for v in views), int(slots.numel()))
    return key, {"views": views, "grids": grids, "slots": slots}


def prefill_entry(engine, st, ids, feed: dict, logits: str) -> dict:
    """Static input buffers and the four stage runners (captured as graphs sharing one pool on a GPU)."""
    bufs = {"ids": torch.empty_like(ids)}
    outs: dict[str, Any] = {}
    stages = []
    pool = torch.cuda.graph_pool_handle() if engine.graphs else None
    model, views, grids = engine.model, feed["views"], feed["grids"]

    def cap(fn):
        return Captured(fn, engine.graphs, pool)

    if views:
        bufs["views"] = [torch.empty_like(v) for v in views]
        bufs["slots"] = torch.empty_like(feed["slots"])
        groups = view_groups(views)
        if engine.projector_layout == "gather":  # where each slot comes from, once per input shape
            layout = slot_sources(views, groups, grids, 4 * engine.spec.sam_patch).to(ids.device)
            # static (outside the graphs' pool), in the projector's dtype: its GEMMs write into it
            bufs["source"] = layout.source(model, model.model.projector.layers.weight)

            def projector():
                return run_projector(model, groups, outs["sam"], outs["clip"], layout, bufs["source"])
        else:
            def projector():
                return run_projector_per_image(model, bufs["views"], groups, grids, outs["sam"], outs["clip"])
        pf = engine.prefill_fns()

        def sam():
            with cudnn_benchmark(engine.cudnn_benchmark):
                return run_sam(model, bufs["views"], groups, engine.sam_attention, pf["sam_block"], engine.positions)

        stages += [
            ("sam", cap(sam)),
            ("clip", cap(lambda: run_clip(model, outs["sam"], pf["clip_layer"], engine.clip_packed,
                                          engine.positions))),
            ("projector", cap(projector)),
        ]

    def lm():
        x = embed_with_images(model, bufs["ids"], bufs.get("slots"), outs.get("projector"))
        return lm_prefill(engine, st, x, logits)

    stages.append(("prefill", cap(lm)))
    return {"bufs": bufs, "outs": outs, "stages": stages}


def lm_prefill(engine, st, x: torch.Tensor, logits: str) -> torch.Tensor:
    """The LM layers over the prompt's embeddings, writing the static cache; float32 logits of every position
    ('all') or the last one (whose final layer then runs on the last position only)."""
    t = x.shape[1]
    cos, sin = engine.cos_t[:t], engine.sin_t[:t]
    fns = engine.prefill_fns()
    engine.compile_prefill_layers(x.shape[0], like=x)
    w = engine.w
    last = len(w.layers) - 1
    for i, lw in enumerate(w.layers):
        layer = fns["lm_last_layer" if i == last and logits != "all" else "lm_layer"]
        keys, values = st.cache.layer_keys(i), st.cache.layer_values(i)
        engine.mark_prefill_sizes(x, cos, sin, keys, values)
        x = layer(x, cos, sin, keys, values, lw.ln1, lw.wqkv, lw.wo, lw.ln2, lw.w13, lw.w2, lw.gate)
    return F.linear(rms_norm(x if logits == "all" else x[:, -1:], w.norm, engine.cfg.eps), w.lm_head).float()


def check_slots(mask: torch.Tensor, views: list[torch.Tensor], grids: list[tuple[int, int]], px: int) -> None:
    """The reference raises when a row's image-slot count differs from its image's; so do we (host values)."""
    counts = mask.sum(1).tolist()
    it = iter(views)
    for row, (tw, th) in enumerate(grids):
        g = next(it).shape[-1] // px  # features per side: pixels / (patch * 4)
        n = g * (g + 1) + 1
        if (tw, th) != (1, 1):
            tile = next(it).shape[-1] // px
            n += (th * tile) * (tw * tile + 1)
        if counts[row] != n:
            raise ValueError(f"row {row}: images_seq_mask has {counts[row]} image slots but the image gives {n}")


