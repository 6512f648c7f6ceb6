"""DeepSeek-OCR top level: vision stages, projector, vision-token layout, token embedding and the LM; the
family-independent parts (VisionLM, CausalLM) that DeepSeek-OCR 2 (deepseek_ocr2.py) shares.

Module paths equal the official checkpoint's tensor prefixes (docs/model-contract.md). Inputs follow the vendor
HF path: `images` is one (crops, global) pair per batch row, `images_spatial_crop` one
(width tiles, height tiles) per row, (1, 1) meaning "global view only" (its crops tensor is ignored).
"""
from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Callable, ContextManager, Sequence

import torch
from torch import nn

from ..registry import get_family
from ..spec import ModelSpec
from .clip import ClipEncoder
from .decoder import DecoderLayer, RMSNorm, check_attn_impl, rope_cos_sin
from .kv_cache import KVCache
from .sam import SamEncoder

ImagePair = tuple[torch.Tensor | None, torch.Tensor]  # (crops [n,3,t,t] or None/zeros, global [1,3,S,S])
StageFn = Callable[[str], ContextManager]  # stage("sam") -> context manager around that stage's work


def no_stage(name: str) -> ContextManager:
    return nullcontext()


class Projector(nn.Module):
    """`model.projector`: one Linear(projector_input_dim -> hidden) named `layers`, as in the checkpoint (both
    families)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.layers = nn.Linear(spec.projector_input_dim, spec.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class VisionLM(nn.Module):
    """What every family's `model` shares: the decoder (embed_tokens, layers, norm), the grouping of views into
    batches per size, and the per-row slot layout. A family adds its vision modules, `VISION_STAGES` (the registry's
    names, in running order), `vision_step` (one stage on one batch of views) and `layout_image`."""

    VISION_STAGES: tuple[str, ...] = ()

    def _init_lm(self, spec, attn_impl: str) -> None:
        """The decoder's modules, registered after the family's vision modules (the checkpoint's order)."""
        h = spec.hidden_size
        self.embed_tokens = nn.Embedding(spec.vocab_size, h)
        self.layers = nn.ModuleList(DecoderLayer(spec, i, attn_impl) for i in range(spec.num_hidden_layers))
        self.norm = RMSNorm(h, spec.rms_norm_eps)

    def vision_modules(self) -> tuple[nn.Module, ...]:
        """The modules one call of which is one vision stage's work (the verification counts their calls)."""
        raise NotImplementedError

    def vision_step(self, name: str, state: dict) -> None:
        """Run stage `name` on one batch of views; `state` starts as {"pixels": [N,3,S,S]} and must end with
        "features" [N, tokens, hidden] after the last stage."""
        raise NotImplementedError

    def layout_image(self, global_feats: torch.Tensor, local_feats: torch.Tensor | None,
                     grid: tuple[int, int]) -> torch.Tensor:
        raise NotImplementedError

    def encode_views(self, views: Sequence[torch.Tensor], stage: StageFn = no_stage) -> list[torch.Tensor]:
        """Encode several view batches, running the encoders once per distinct view size. `stage(name)` wraps
        all calls of each vision stage in turn (e.g. all SAM calls, then all CLIP calls, then all projector
        calls), so a caller can time the stages while one-shot generation runs exactly the same code."""
        groups: dict[tuple, list[int]] = {}
        for i, v in enumerate(views):
            groups.setdefault(tuple(v.shape[1:]), []).append(i)
        states = [{"pixels": torch.cat([views[i] for i in idxs]) if len(idxs) > 1 else views[idxs[0]]}
                  for idxs in groups.values()]
        for name in self.VISION_STAGES:
            with stage(name):
                for state in states:
                    self.vision_step(name, state)
        out: list[torch.Tensor | None] = [None] * len(views)
        for idxs, state in zip(groups.values(), states):
            for i, part in zip(idxs, state["features"].split([views[i].shape[0] for i in idxs])):
                out[i] = part
        return out

    def vision_embeddings(self, images: Sequence[ImagePair], images_spatial_crop,
                          stage: StageFn = no_stage) -> list[torch.Tensor]:
        """Per batch row, the image's slot embeddings [slots, H]. Rows with grid (1, 1) run no local views.
        `stage` as in encode_views; the slot layout counts as part of the projector stage."""
        grids = _grids(images_spatial_crop, len(images))
        feats = iter(self.encode_views(view_list(images, grids), stage))
        out = []
        with stage("projector"):
            for tw, th in grids:
                glob = next(feats)[0]
                local = next(feats) if (tw, th) != (1, 1) else None
                out.append(self.layout_image(glob, local, (tw, th)))
        return out

    # --- language model ---
    def embed(self, input_ids: torch.Tensor, images_seq_mask: torch.Tensor | None = None,
              image_embeds: Sequence[torch.Tensor | None] | None = None) -> torch.Tensor:
        """Token embeddings [B, S, H] with each row's image slots (images_seq_mask True) replaced in order."""
        x = self.embed_tokens(input_ids)
        if image_embeds is None:
            return x
        if images_seq_mask is None or len(image_embeds) != x.shape[0]:
            raise ValueError("image embeddings need images_seq_mask and one entry per batch row")
        rows = []
        for b, emb in enumerate(image_embeds):
            if emb is None:
                rows.append(x[b])
                continue
            mask = images_seq_mask[b].to(x.device)
            if not mask.is_meta:
                n = int(mask.sum())
                if n != emb.shape[0]:
                    raise ValueError(f"row {b}: images_seq_mask has {n} image slots but the image gives {emb.shape[0]}")
            rows.append(x[b].masked_scatter(mask[:, None], emb.to(x.dtype)))
        return torch.stack(rows)

    def decode(self, x: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Decoder layers + final norm over embeddings [B, S, H]; positions continue from cache.length."""
        start = cache.length
        positions = torch.arange(start, start + x.shape[1], device=x.device)
        cos, sin = rope_cos_sin(positions, self.spec.head_dim, self.spec.rope_theta, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, cache)
        return self.norm(x)


class DeepseekOCRModel(VisionLM):
    """`model`: everything but lm_head."""

    VISION_STAGES = get_family("deepseek-ocr").vision_stages  # the order forward() runs them in

    def __init__(self, spec: ModelSpec, attn_impl: str = "sdpa"):
        super().__init__()
        self.spec = spec
        h = spec.hidden_size
        self.sam_model = SamEncoder(spec)
        self.vision_model = ClipEncoder(spec)
        self.projector = Projector(spec)
        self.image_newline = nn.Parameter(torch.zeros(h))
        self.view_seperator = nn.Parameter(torch.zeros(h))  # (sic) the checkpoint's spelling
        self._init_lm(spec, attn_impl)

    # --- vision ---
    def vision_modules(self) -> tuple[nn.Module, ...]:
        return (self.sam_model, self.vision_model, self.projector)

    def vision_step(self, name: str, state: dict) -> None:
        if name == "sam":
            state["sam"] = self.sam_model(state["pixels"])
        elif name == "clip":
            state["clip"] = self.vision_model(state["sam"])
        else:
            state["features"] = self.project(state["clip"], state["sam"])

    def project(self, clip: torch.Tensor, sam: torch.Tensor) -> torch.Tensor:
        """CLIP [N, 1+g*g, C] and SAM [N, C_sam, g, g] -> [N, g*g, hidden]: CLIP (CLS dropped) first, then SAM."""
        return self.projector(self.projector_input(clip, sam))

    @staticmethod
    def projector_input(clip: torch.Tensor, sam: torch.Tensor) -> torch.Tensor:
        """The projector's input [N, g*g, C + C_sam]: each position's CLIP features (CLS dropped), then SAM's."""
        return torch.cat([clip[:, 1:], sam.flatten(2).transpose(1, 2)], dim=-1)

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        """Views [N, 3, S, S] -> features [N, (S/64)^2, hidden] through SAM, CLIP and the projector."""
        sam = self.sam_model(pixels)
        return self.project(self.vision_model(sam), sam)

    def _rows_with_newline(self, grid: torch.Tensor) -> torch.Tensor:
        """[rows, cols, H] -> [rows * (cols + 1), H]: image_newline after every row."""
        rows, _, h = grid.shape
        newline = self.image_newline.to(grid.dtype).expand(rows, 1, h)
        return torch.cat([grid, newline], dim=1).reshape(-1, h)

    def layout_image(self, global_feats: torch.Tensor, local_feats: torch.Tensor | None,
                     grid: tuple[int, int]) -> torch.Tensor:
        """One image's slots [slots, H]: stitched local tiles with newlines, global grid with newlines,
        view_seperator. global_feats [g*g, H]; local_feats [tw*th, t*t, H] in row-major tile order or None."""
        tw, th = grid
        h = global_feats.shape[-1]
        parts = []
        if (tw, th) != (1, 1):
            if local_feats is None:
                raise ValueError(f"grid {tw}x{th} needs local tile features")
            n, tt, _ = local_feats.shape
            t = math.isqrt(tt)
            if n != tw * th or t * t != tt:
                raise ValueError(f"local features {tuple(local_feats.shape)} do not fit a {tw}x{th} grid of "
                                 "square tiles")
            # tile (r, c) is local_feats[r*tw + c]; stitch into one (th*t) x (tw*t) map
            stitched = local_feats.view(th, tw, t, t, h).permute(0, 2, 1, 3, 4).reshape(th * t, tw * t, h)
            parts.append(self._rows_with_newline(stitched))
        g = math.isqrt(global_feats.shape[0])
        if g * g != global_feats.shape[0]:
            raise ValueError(f"global features {tuple(global_feats.shape)} are not a square grid")
        parts.append(self._rows_with_newline(global_feats.reshape(g, g, h)))
        parts.append(self.view_seperator.to(global_feats.dtype)[None])
        return torch.cat(parts)


class CausalLM(nn.Module):
    """`model` + untied `lm_head`, for any family: MODEL is the family's `model` class. attn_impl picks the LM
    attention ('eager' or 'sdpa'); the vision stages use SDPA."""

    MODEL: type = VisionLM

    def __init__(self, spec, attn_impl: str = "sdpa"):
        super().__init__()
        self.spec = spec
        self.model = self.MODEL(spec, check_attn_impl(attn_impl))
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)

    @property
    def attn_impl(self) -> str:
        return self.model.layers[0].self_attn.attn_impl

    def set_attn_impl(self, attn_impl: str) -> None:
        check_attn_impl(attn_impl)
        for layer in self.model.layers:
            layer.self_attn.attn_impl = attn_impl

    def forward_lm(self, x: torch.Tensor, cache: KVCache | None = None,
                   logits: str = "all") -> tuple[torch.Tensor, KVCache]:
        """Embeddings [B, S, H] -> float32 logits [B, S, V] ('all') or [B, 1, V] ('last'), and the cache
        (a new one when None is given)."""
        if logits not in ("all", "last"):
            raise ValueError(f"logits must be 'all' or 'last', got {logits!r}")
        cache = KVCache() if cache is None else cache
        h = self.model.decode(x, cache)
        if logits == "last":
            h = h[:, -1:]
        return self.lm_head(h).float(), cache

    def forward(self, input_ids: torch.Tensor, images: Sequence[ImagePair] | None = None,
                images_seq_mask: torch.Tensor | None = None, images_spatial_crop=None,
                cache: KVCache | None = None, logits: str = "all") -> tuple[torch.Tensor, KVCache]:
        """Prefill (runs the vision stages when images are given) or decode step (S == 1: vision never runs)."""
        image_embeds = None
        if images is not None and input_ids.shape[1] > 1:
            if images_seq_mask is None or images_spatial_crop is None:
                raise ValueError("images need images_seq_mask and images_spatial_crop")
            image_embeds = self.model.vision_embeddings(images, images_spatial_crop)
        x = self.model.embed(input_ids, images_seq_mask, image_embeds)
        return self.forward_lm(x, cache=cache, logits=logits)


class DeepseekOCRForCausalLM(CausalLM):
    """DeepSeek-OCR: SAM + CLIP + projector + the MoE decoder."""

    MODEL = DeepseekOCRModel


def view_list(images: Sequence[ImagePair], grids: list[tuple[int, int]]) -> list[torch.Tensor]:
    """The views of every row in encoding order: global [1,3,S,S], then its crops when tiled."""
    views = []
    for row, ((crops, glob), (tw, th)) in enumerate(zip(images, grids)):
        views.append(glob if glob.dim() == 4 else glob[None])
        if (tw, th) != (1, 1):
            if crops is None or crops.shape[0] != tw * th:
                got = None if crops is None else tuple(crops.shape)
                raise ValueError(f"row {row}: grid {tw}x{th} needs {tw * th} crops, got {got}")
            views.append(crops)
    return views


def _grids(images_spatial_crop, rows: int) -> list[tuple[int, int]]:
    """[[tw, th], ...] per row from a tensor ([B, 2] or [B, 1, 2], on any real device) or a list."""
    if isinstance(images_spatial_crop, torch.Tensor):
        if images_spatial_crop.is_meta:
            raise ValueError("images_spatial_crop is layout metadata: pass it on CPU or as a list, not on meta")
        images_spatial_crop = images_spatial_crop.reshape(-1, 2).tolist()
    grids = [(int(tw), int(th)) for tw, th in images_spatial_crop]
    if len(grids) != rows:
        raise ValueError(f"{len(grids)} images_spatial_crop entries for {rows} image rows")
    if any(tw < 1 or th < 1 for tw, th in grids):
        raise ValueError(f"crop grids must be positive, got {grids}")
    return grids
