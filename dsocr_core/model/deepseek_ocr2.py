"""DeepSeek-OCR 2 top level: SAM (net_3 -> 896 channels), the query encoder, a linear projector, the slot layout
and the shared decoder.

Inputs are those of DeepSeek-OCR (one (crops, global) pair per row, one (width tiles, height tiles) grid per row):
crops [k, 3, 768, 768] (k = 0 or 2..6) and the global view [1, 3, 1024, 1024]. An image's slots are the crops'
features in row-major tile order (144 each), the global view's 256, then `view_seperator`; no newline slots.
"""
from __future__ import annotations

import torch
from torch import nn

from ..registry import get_family
from ..spec_v2 import OCR2Spec
from .deepseek_ocr import CausalLM, Projector, VisionLM
from .encoder_v2 import QueryEncoder
from .sam import SamEncoder


class DeepseekOCR2Model(VisionLM):
    """`model`: everything but lm_head."""

    VISION_STAGES = get_family("deepseek-ocr2").vision_stages  # the order forward() runs them in

    def __init__(self, spec: OCR2Spec, attn_impl: str = "sdpa"):
        super().__init__()
        self.spec = spec
        self.sam_model = SamEncoder(spec)
        self.qwen2_model = QueryEncoder(spec)
        self.projector = Projector(spec)
        self.view_seperator = nn.Parameter(torch.zeros(spec.hidden_size))  # (sic) the checkpoint's spelling
        self._init_lm(spec, attn_impl)

    def vision_modules(self) -> tuple[nn.Module, ...]:
        return (self.sam_model, self.qwen2_model, self.projector)

    def vision_step(self, name: str, state: dict) -> None:
        if name == "sam":
            state["sam"] = self.sam_model(state["pixels"])
        elif name == "encoder":
            state["encoder"] = self.qwen2_model(state.pop("sam"))
        else:
            state["features"] = self.projector(state.pop("encoder"))

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        """Views [N, 3, S, S] -> features [N, (S/64)^2, hidden] through SAM, the encoder and the projector."""
        return self.projector(self.qwen2_model(self.sam_model(pixels)))

    def layout_image(self, global_feats: torch.Tensor, local_feats: torch.Tensor | None,
                     grid: tuple[int, int]) -> torch.Tensor:
        """One image's slots [slots, H]: the crops' features in order, the global view's, view_seperator.
        global_feats [g*g, H]; local_feats [tw*th, t*t, H] in row-major tile order or None."""
        tw, th = grid
        h = global_feats.shape[-1]
        parts = []
        if (tw, th) != (1, 1):
            if local_feats is None:
                raise ValueError(f"grid {tw}x{th} needs local tile features")
            if local_feats.shape[0] != tw * th:
                raise ValueError(f"local features {tuple(local_feats.shape)} do not fit a {tw}x{th} grid")
            parts.append(local_feats.reshape(-1, h))
        parts.append(global_feats)
        parts.append(self.view_seperator.to(global_feats.dtype)[None])
        return torch.cat(parts)


class DeepseekOCR2ForCausalLM(CausalLM):
    """DeepSeek-OCR 2: SAM + query encoder + projector + the MoE decoder."""

    MODEL = DeepseekOCR2Model
