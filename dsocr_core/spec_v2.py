"""DeepSeek-OCR 2's dimensions: the shared decoder and SAM (its net_3 emits 896 channels) plus the Qwen2-shaped
encoder ("DeepEncoder V2") with learnable queries, and a Linear(896 -> 1280) projector.

The vendor config.json states few vision sizes and some of them stale (`downsample_channels` [512, 1024] while the
code builds 896); the vendor code hard-codes the rest. Our reader takes the stated SAM sizes, the encoder width
from `vision_config.width["qwen2-0-5b"].dim` (net_3's output is that width), and the encoder sizes this project
writes beside it for non-official presets; absent keys take the official values.
"""
from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from .spec import (MAX_HEADS, MAX_IMAGE, MAX_LAYERS, MAX_WIDTH, SAM_KEYS, DecoderSpec, SpecError, _pick,
                   check_linear_projector)

ENCODER_KEY = "qwen2-0-5b"  # vision_config.width key of the encoder


class OCR2Spec(DecoderSpec):
    family: ClassVar[str] = "deepseek-ocr2"

    sam_downsample: tuple[int, int] = (512, 896)  # net_3 emits the encoder width

    # --- Qwen2-shaped encoder (Qwen2-0.5B sizes; no embedding table, no LM head) ---
    enc_hidden: int = Field(896, gt=0, le=MAX_WIDTH)
    enc_layers: int = Field(24, gt=0, le=MAX_LAYERS)
    enc_heads: int = Field(14, gt=0, le=MAX_HEADS)
    enc_kv_heads: int = Field(2, gt=0, le=MAX_HEADS)  # grouped-query attention
    enc_intermediate: int = Field(4864, gt=0, le=MAX_WIDTH)  # SwiGLU
    enc_rope_theta: float = Field(1_000_000.0, gt=0)
    enc_rms_eps: float = Field(1e-6, gt=0)
    query_views: tuple[int, ...] = (768, 1024)  # view sides with a learnable query table `query_<side>`

    @model_validator(mode="after")
    def _consistent_v2(self) -> "OCR2Spec":
        problems = []
        if self.enc_hidden % self.enc_heads:
            problems.append("enc_hidden must be divisible by enc_heads")
        elif (self.enc_hidden // self.enc_heads) % 2:
            problems.append("the encoder head dim must be even for rotary embeddings")
        if self.enc_heads % self.enc_kv_heads:
            problems.append("enc_heads must be a multiple of enc_kv_heads (grouped-query attention)")
        if self.sam_downsample[1] != self.enc_hidden:
            problems.append("SAM output channels (sam_downsample[1]) must equal enc_hidden: SAM features are the "
                            "encoder's visual tokens")
        if any(side % 64 or not 0 < side <= MAX_IMAGE for side in self.query_views):
            problems.append(f"query_views {self.query_views} must be multiples of 64 (one token per 64 px) "
                            f"in 64..{MAX_IMAGE}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def enc_head_dim(self) -> int:
        return self.enc_hidden // self.enc_heads

    @property
    def projector_input_dim(self) -> int:
        return self.enc_hidden  # one Linear per query output

    def queries(self, side: int) -> int:
        """Learnable queries of a view of `side` pixels = its visual tokens (one per 64x64 px)."""
        return (side // 64) ** 2

    # --- vendor config.json <-> spec ---
    @classmethod
    def from_config_dict(cls, raw: object, source: str = "config") -> "OCR2Spec":
        from .spec import lm_fields_from_config

        fields = lm_fields_from_config(cls, raw, source)
        vision = raw.get("vision_config") if isinstance(raw.get("vision_config"), dict) else {}
        widths = vision.get("width") if isinstance(vision.get("width"), dict) else {}
        sam = widths.get("sam_vit_b") if isinstance(widths.get("sam_vit_b"), dict) else {}
        enc = widths.get(ENCODER_KEY) if isinstance(widths.get(ENCODER_KEY), dict) else {}
        fields.update(_pick(sam, SAM_KEYS))
        fields.update(_pick(enc, {"dim": "enc_hidden", "layers": "enc_layers", "heads": "enc_heads",
                                  "kv_heads": "enc_kv_heads", "intermediate_size": "enc_intermediate",
                                  "rope_theta": "enc_rope_theta", "rms_norm_eps": "enc_rms_eps"}))
        down = sam.get("downsample_channels")
        # net_2's width as stated; net_3's is the encoder width (the official file's second value is stale)
        first = down[0] if isinstance(down, list) and down else 512
        fields["sam_downsample"] = (first, fields.get("enc_hidden", 896))
        proj = raw.get("projector_config") if isinstance(raw.get("projector_config"), dict) else {}
        check_linear_projector(proj, fields, source)
        if "input_dim" in proj and proj["input_dim"] != fields.get("enc_hidden", 896):
            raise SpecError(f"{source}: projector input_dim {proj['input_dim']} differs from the encoder width "
                            f"{fields.get('enc_hidden', 896)}")
        return cls._from_fields(fields, source, "DeepSeek-OCR 2")

    def to_config_dict(self) -> dict:
        """Vendor-format config.json (the official keys; encoder sizes beside `dim` so other presets load back)."""
        from .spec import lm_config_dict, sam_config_dict

        lm = lm_config_dict(self)
        return {
            **{k: v for k, v in lm.items() if k != "model_type"},
            "architectures": ["DeepseekOCR2ForCausalLM"],
            "model_type": "deepseek_vl_v2",
            "candidate_resolutions": [[1024, 1024]], "global_view_pos": "head", "tile_tag": "2D",
            "language_config": {**lm, "architectures": ["DeepseekV2ForCausalLM"]},
            "vision_config": {
                "image_size": self.sam_image_size, "model_name": "deepencoderv2", "model_type": "vision",
                "width": {
                    ENCODER_KEY: {"dim": self.enc_hidden, "layers": self.enc_layers, "heads": self.enc_heads,
                                  "kv_heads": self.enc_kv_heads, "intermediate_size": self.enc_intermediate,
                                  "rope_theta": self.enc_rope_theta, "rms_norm_eps": self.enc_rms_eps},
                    "sam_vit_b": sam_config_dict(self),
                },
            },
            "projector_config": {"projector_type": "linear", "input_dim": self.enc_hidden,
                                 "n_embed": self.hidden_size, "model_type": "mlp_projector"},
        }


def tiny_spec_v2() -> OCR2Spec:
    """A CPU-test size with every structural feature kept: windowed + global SAM blocks, GQA encoder with both
    query tables, dense layer 0 and MoE with shared experts, the full vocabulary (official special ids)."""
    return OCR2Spec(
        hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        intermediate_size=128, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2,
        n_shared_experts=2, first_k_dense_replace=1,
        sam_width=32, sam_layers=4, sam_heads=2, sam_global_blocks=(1, 3), sam_mlp_dim=64,
        sam_neck_dim=16, sam_downsample=(32, 48),
        enc_hidden=48, enc_layers=2, enc_heads=4, enc_kv_heads=2, enc_intermediate=96,
    )


PRESETS = {"full": OCR2Spec, "tiny": tiny_spec_v2}
