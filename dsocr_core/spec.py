"""Frozen descriptions of what runs (ModelSpec), on what input (Workload) and on which GPU (Hardware).

One ModelSpec feeds both the torch model and the analytic model, so a tiny test spec and the official
3.3B spec go through exactly the same code. Defaults are the official DeepSeek-OCR values.
"""
from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from . import jsonfile

Mode = str  # a mode name of any model family (dsocr_core/registry.py)
Dtype = Literal["bfloat16", "float16", "float32"]
AttnImpl = Literal["eager", "sdpa", "flash"]
LogitsMode = Literal["all", "last"]

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


class SpecError(ValueError):
    """A config, workload or hardware description that cannot describe a real run."""


class _Frozen(BaseModel):
    # an infinite or NaN float describes no real model, input or GPU (JSON readers accept Infinity and NaN)
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


# Upper bounds of a config's sizes: far beyond any published model (DeepSeek-V3: 61 layers, 256 experts, width
# 7168), yet small enough that the analytic model and a meta-device build stay in seconds and megabytes. A config
# past them (10^5 layers, 10^7 experts) is refused before anything is sized from it.
MAX_LAYERS = 2048
MAX_EXPERTS = 1 << 16
MAX_WIDTH = 1 << 17
MAX_HEADS = 1 << 12
MAX_VOCAB = 1 << 22
MAX_POSITIONS = 1 << 24
MAX_IMAGE = 1 << 14
MAX_CONFIG_BYTES = 1 << 20  # a vendor config.json is about 3 KB
MAX_CONFIG_DEPTH = 32  # and 4 levels deep


class DecoderSpec(_Frozen):
    """What every model of the family shares: the DeepseekV2 MoE decoder and the SAM ViT-B tokenizer (its last
    conv's width differs). Subclasses add the second vision stage; `family` names the registry entry
    (dsocr_core/registry.py) that describes the model's stages, modes and checkpoint layout."""

    family: ClassVar[str] = ""

    # --- language model (DeepseekV2 without MLA) ---
    hidden_size: int = Field(1280, gt=0, le=MAX_WIDTH)
    num_hidden_layers: int = Field(12, gt=0, le=MAX_LAYERS)
    num_attention_heads: int = Field(10, gt=0, le=MAX_HEADS)
    num_key_value_heads: int = Field(10, gt=0, le=MAX_HEADS)
    intermediate_size: int = Field(6848, gt=0, le=MAX_WIDTH)  # dense SwiGLU in the first_k_dense_replace layers
    moe_intermediate_size: int = Field(896, gt=0, le=MAX_WIDTH)  # one routed expert
    n_routed_experts: int = Field(64, gt=0, le=MAX_EXPERTS)
    num_experts_per_tok: int = Field(6, gt=0)
    # realised as one MLP of width n_shared * moe_intermediate_size
    n_shared_experts: int = Field(2, ge=0, le=MAX_EXPERTS)
    first_k_dense_replace: int = Field(1, ge=0)
    vocab_size: int = Field(129280, gt=0, le=MAX_VOCAB)
    max_position_embeddings: int = Field(8192, gt=0, le=MAX_POSITIONS)
    bos_token_id: int = 0
    eos_token_id: int = 1
    pad_token_id: int = 2
    image_token_id: int = 128815
    rope_theta: float = Field(10000.0, gt=0)
    rms_norm_eps: float = Field(1e-6, gt=0, lt=1)
    norm_topk_prob: bool = False
    routed_scaling_factor: float = Field(1.0, gt=0)

    # --- SAM ViT-B ---
    sam_width: int = Field(768, gt=0, le=MAX_WIDTH)
    sam_layers: int = Field(12, gt=0, le=MAX_LAYERS)
    sam_heads: int = Field(12, gt=0, le=MAX_HEADS)
    sam_global_blocks: tuple[int, ...] = (2, 5, 8, 11)
    sam_window: int = Field(14, gt=0, le=MAX_IMAGE)
    sam_patch: int = Field(16, gt=0, le=MAX_IMAGE)
    sam_image_size: int = Field(1024, gt=0, le=MAX_IMAGE)  # pos_embed is sized for this image: 64x64 patches
    sam_mlp_dim: int = Field(3072, gt=0, le=MAX_WIDTH)
    sam_neck_dim: int = Field(256, gt=0, le=MAX_WIDTH)
    sam_downsample: tuple[int, int] = (512, 1024)  # net_2, net_3 output channels

    @model_validator(mode="after")
    def _consistent_shared(self) -> "DecoderSpec":
        problems = []
        if self.hidden_size % self.num_attention_heads:
            problems.append("hidden_size must be divisible by num_attention_heads")
        if self.num_key_value_heads != self.num_attention_heads:
            problems.append("DeepSeek-OCR uses plain multi-head attention: num_key_value_heads must equal num_attention_heads")
        if self.head_dim % 2:
            problems.append("head_dim must be even for rotary embeddings")
        if self.num_experts_per_tok > self.n_routed_experts:
            problems.append("num_experts_per_tok cannot exceed n_routed_experts")
        if self.first_k_dense_replace > self.num_hidden_layers:
            problems.append("first_k_dense_replace cannot exceed num_hidden_layers")
        if self.sam_width % self.sam_heads:
            problems.append("sam_width must be divisible by sam_heads")
        if any(b < 0 or b >= self.sam_layers for b in self.sam_global_blocks):
            problems.append(f"sam_global_blocks {self.sam_global_blocks} must lie in 0..{self.sam_layers - 1}")
        if not all(0 < c <= MAX_WIDTH for c in self.sam_downsample):
            problems.append(f"sam_downsample {self.sam_downsample} must lie in 1..{MAX_WIDTH}")
        if self.sam_image_size % self.sam_patch:
            problems.append("sam_image_size must be a multiple of sam_patch")
        special = [self.bos_token_id, self.eos_token_id, self.pad_token_id, self.image_token_id]
        if max(special) >= self.vocab_size or min(special) < 0:
            problems.append(f"special token ids {special} must lie inside vocab_size {self.vocab_size}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    # --- derived sizes (not stored, so they can never disagree) ---
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def shared_intermediate_size(self) -> int:
        return self.n_shared_experts * self.moe_intermediate_size

    @property
    def moe_layers(self) -> list[int]:
        return list(range(self.first_k_dense_replace, self.num_hidden_layers))

    @property
    def sam_pos_grid(self) -> int:
        return self.sam_image_size // self.sam_patch

    @classmethod
    def from_config_json(cls, path: str | Path) -> "DecoderSpec":
        """Read a checkpoint folder's (or file's) vendor-format config.json. Raises SpecError with every problem."""
        path, raw = read_config_json(path)
        return cls.from_config_dict(raw, source=str(path))

    @classmethod
    def _from_fields(cls, fields: dict, source: str, label: str) -> "DecoderSpec":
        """The spec of fields read from a config; SpecError naming every invalid field otherwise."""
        try:
            return cls(**fields)
        except ValidationError as exc:
            msgs = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in exc.errors())
            raise SpecError(f"{source}: invalid {label} config: {msgs}") from None

    @classmethod
    def from_config_dict(cls, raw: object, source: str = "config") -> "DecoderSpec":
        raise NotImplementedError  # each model reads its own vision keys

    def replace(self, **changes) -> "DecoderSpec":
        """A copy with some fields changed, validated again."""
        try:
            return type(self)(**{**self.model_dump(), **changes})
        except ValidationError as exc:
            raise SpecError(f"invalid spec change {changes}: {exc.errors()[0]['msg']}") from None


def check_linear_projector(proj: dict, fields: dict, source: str) -> None:
    """A config's projector_config must describe the one projector both models have: a Linear into hidden_size."""
    if proj.get("projector_type", "linear") != "linear":
        raise SpecError(f"{source}: projector_type {proj.get('projector_type')!r} is not supported (linear only)")
    if "n_embed" in proj and proj["n_embed"] != fields.get("hidden_size", 1280):
        raise SpecError(f"{source}: projector n_embed {proj['n_embed']} differs from hidden_size")


class ModelSpec(DecoderSpec):
    """Every dimension of DeepSeek-OCR. Defaults = the official checkpoint (its config.json plus the vision sizes
    the vendor code hard-codes)."""

    family: ClassVar[str] = "deepseek-ocr"

    # --- CLIP-L/14 ---
    clip_width: int = Field(1024, gt=0, le=MAX_WIDTH)
    clip_layers: int = Field(24, gt=0, le=MAX_LAYERS)
    clip_heads: int = Field(16, gt=0, le=MAX_HEADS)
    clip_patch: int = Field(14, gt=0, le=MAX_IMAGE)
    clip_image_size: int = Field(224, gt=0, le=MAX_IMAGE)  # 16x16 positions + CLS
    clip_mlp_dim: int = Field(4096, gt=0, le=MAX_WIDTH)

    # --- projector ---
    projector_input_dim: int = Field(2048, gt=0, le=2 * MAX_WIDTH)

    @model_validator(mode="after")
    def _consistent(self) -> "ModelSpec":
        problems = []
        if self.clip_width % self.clip_heads:
            problems.append("clip_width must be divisible by clip_heads")
        if self.sam_downsample[1] != self.clip_width:
            problems.append("SAM output channels (sam_downsample[1]) must equal clip_width: SAM features are "
                            "CLIP's patch embeddings")
        if self.projector_input_dim != self.clip_width + self.sam_downsample[1]:
            problems.append("projector_input_dim must equal clip_width + sam_downsample[1] (CLIP and SAM features "
                            "concatenated)")
        if self.clip_image_size % self.clip_patch:
            problems.append("clip_image_size must be a multiple of clip_patch")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def clip_pos_grid(self) -> int:
        return self.clip_image_size // self.clip_patch

    # --- vendor config.json <-> spec ---
    @classmethod
    def from_config_dict(cls, raw: object, source: str = "config") -> "ModelSpec":
        fields = lm_fields_from_config(cls, raw, source)
        vision = raw.get("vision_config") or {}
        widths = vision.get("width") if isinstance(vision, dict) else None
        if isinstance(widths, dict):
            sam = widths.get("sam_vit_b") or {}
            clip = widths.get("clip-l-14-224") or {}
            fields.update(_pick(sam, {**SAM_KEYS, "downsample_channels": "sam_downsample"}))
            fields.update(_pick(clip, {"width": "clip_width", "layers": "clip_layers", "heads": "clip_heads",
                                       "patch_size": "clip_patch", "image_size": "clip_image_size",
                                       "mlp_dim": "clip_mlp_dim"}))
        proj = raw.get("projector_config") or {}
        if isinstance(proj, dict):
            check_linear_projector(proj, fields, source)
            if "input_dim" in proj:
                fields["projector_input_dim"] = proj["input_dim"]
        return cls._from_fields(fields, source, "DeepSeek-OCR")

    def to_config_dict(self) -> dict:
        """Vendor-format config.json content (LM keys at the top level and under language_config)."""
        lm = lm_config_dict(self)
        return {
            **{k: v for k, v in lm.items() if k != "model_type"},
            "architectures": ["DeepseekOCRForCausalLM"],
            "model_type": "deepseek_vl_v2",
            "image_token_id": self.image_token_id,
            "language_config": lm,
            "vision_config": {
                "image_size": self.sam_image_size, "model_name": "deeplip_b_l", "model_type": "vision",
                "width": {
                    "sam_vit_b": sam_config_dict(self),
                    "clip-l-14-224": {
                        "width": self.clip_width, "layers": self.clip_layers, "heads": self.clip_heads,
                        "patch_size": self.clip_patch, "image_size": self.clip_image_size,
                        "mlp_dim": self.clip_mlp_dim,
                    },
                },
            },
            "projector_config": {"projector_type": "linear", "input_dim": self.projector_input_dim,
                                 "n_embed": self.hidden_size, "model_type": "mlp_projector"},
        }


# vision_config.width.sam_vit_b keys -> spec fields, the same in every family
SAM_KEYS = {"width": "sam_width", "layers": "sam_layers", "heads": "sam_heads",
            "global_attn_indexes": "sam_global_blocks",
            "window_size": "sam_window", "patch_size": "sam_patch", "image_size": "sam_image_size",
            "mlp_dim": "sam_mlp_dim", "neck_dim": "sam_neck_dim"}


def lm_fields_from_config(cls: type, raw: object, source: str) -> dict:
    """The decoder's fields of a vendor config.json (top level, which the vendor code reads, over
    language_config), after the checks every family shares. Raises SpecError naming the file and the field."""
    from .registry import family_of_config

    if not isinstance(raw, dict):
        raise SpecError(f"{source}: expected a JSON object, got {type(raw).__name__}")
    lm = raw.get("language_config") if isinstance(raw.get("language_config"), dict) else {}
    top = {**lm, **{k: v for k, v in raw.items() if not isinstance(v, dict)}}
    known = ("deepseek_vl_v2", "deepseek_ocr", "deepseekocr")
    looks_vendor = raw.get("model_type") in known or "vision_config" in raw or "projector_config" in raw
    if not looks_vendor:
        raise SpecError(
            f"{source}: not a DeepSeek-OCR config (model_type={raw.get('model_type')!r}, "
            "no vision_config or projector_config)"
        )
    found = family_of_config(raw)
    if found.name != cls.family:
        raise SpecError(f"{source}: this is a {found.label} config ({found.checkpoint.architecture}); "
                        f"load it as model {found.name!r}")
    if top.get("use_mla"):
        raise SpecError(f"{source}: use_mla=true is not DeepSeek-OCR (its decoder uses plain MHA)")
    if top.get("topk_method", "greedy") != "greedy" or top.get("scoring_func", "softmax") != "softmax":
        raise SpecError(f"{source}: only greedy top-k routing with softmax scoring is supported")
    if "moe_layer_freq" in top and top["moe_layer_freq"] != 1:
        raise SpecError(f"{source}: moe_layer_freq must be 1")
    return {name: top[name] for name in DecoderSpec.model_fields if name in top and not name.startswith("sam_")}


def sam_config_dict(spec) -> dict:
    """The vendor config's vision_config.width.sam_vit_b of a spec (both model families share the SAM tokenizer)."""
    return {"width": spec.sam_width, "layers": spec.sam_layers, "heads": spec.sam_heads,
            "global_attn_indexes": list(spec.sam_global_blocks), "window_size": spec.sam_window,
            "patch_size": spec.sam_patch, "image_size": spec.sam_image_size, "mlp_dim": spec.sam_mlp_dim,
            "neck_dim": spec.sam_neck_dim, "downsample_channels": list(spec.sam_downsample)}


def lm_config_dict(spec: DecoderSpec) -> dict:
    """The decoder's keys of a vendor config.json (written at the top level and under language_config)."""
    return {
        "hidden_size": spec.hidden_size, "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads, "num_key_value_heads": spec.num_key_value_heads,
        "intermediate_size": spec.intermediate_size, "moe_intermediate_size": spec.moe_intermediate_size,
        "n_routed_experts": spec.n_routed_experts, "num_experts_per_tok": spec.num_experts_per_tok,
        "n_shared_experts": spec.n_shared_experts, "first_k_dense_replace": spec.first_k_dense_replace,
        "vocab_size": spec.vocab_size, "max_position_embeddings": spec.max_position_embeddings,
        "bos_token_id": spec.bos_token_id, "eos_token_id": spec.eos_token_id,
        "pad_token_id": spec.pad_token_id, "rope_theta": spec.rope_theta, "rms_norm_eps": spec.rms_norm_eps,
        "norm_topk_prob": spec.norm_topk_prob, "routed_scaling_factor": spec.routed_scaling_factor,
        "use_mla": False, "q_lora_rank": None, "kv_lora_rank": None, "topk_method": "greedy",
        "n_group": 1, "topk_group": 1, "moe_layer_freq": 1, "scoring_func": "softmax",
        "torch_dtype": "bfloat16", "model_type": "deepseek_v2",
    }


def read_config_json(path: str | Path) -> tuple[Path, object]:
    """(path of the config.json, its parsed content) of a checkpoint folder or a config file; its size and depth
    are bounded before it is parsed, and every failure is a SpecError naming the file."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        raise SpecError(f"no config.json at {path}")
    return path, jsonfile.load(path, SpecError, MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH)


def _pick(src: dict, mapping: dict[str, str]) -> dict:
    out = {}
    for key, field in mapping.items():
        if key in src:
            value = src[key]
            out[field] = tuple(value) if isinstance(value, list) else value
    return out


def tiny_spec() -> ModelSpec:
    """A spec small enough for CPU tests: every structural feature kept (windowed + global SAM blocks,
    dense layer 0, MoE with shared experts, full vocabulary so the official special ids stay valid)."""
    return ModelSpec(
        hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        intermediate_size=128, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2,
        n_shared_experts=2, first_k_dense_replace=1,
        sam_width=32, sam_layers=4, sam_heads=2, sam_global_blocks=(1, 3), sam_mlp_dim=64,
        sam_neck_dim=16, sam_downsample=(32, 48),
        clip_width=48, clip_layers=2, clip_heads=4, clip_mlp_dim=96,
        projector_input_dim=96,
    )


PRESETS = {"full": ModelSpec, "tiny": tiny_spec}


class Workload(_Frozen):
    """One inference request shape. Either `image_size` or `crops` (or neither for untiled modes). The mode says
    which model family's tiling applies; the crop range defaults to the mode's (gundam 2..9, dynamic 2..6)."""

    mode: Mode = "gundam"
    image_size: tuple[int, int] | None = None  # (width, height) of the original page in pixels
    crops: tuple[int, int] | None = None  # explicit tile grid (width tiles, height tiles); overrides image_size
    min_crops: int = Field(2, ge=1)
    max_crops: int = Field(9, ge=1)
    text_tokens: int = Field(10, ge=1)  # non-image prompt tokens, BOS included (grounding prompt: 10)
    batch: int = Field(1, ge=1)
    decode_steps: int = Field(0, ge=0)
    dtype: Dtype = "bfloat16"
    attn: AttnImpl = "sdpa"
    logits: LogitsMode = "all"  # "all": fp32 logits at every prefill position (vendor HF); "last": vLLM

    @model_validator(mode="before")
    @classmethod
    def _mode_defaults(cls, data):
        """Crop range not given: the mode's own default range."""
        from .registry import mode_info

        if isinstance(data, dict):
            try:
                info = mode_info(data.get("mode", "gundam"))
            except SpecError as exc:
                raise ValueError(str(exc)) from None
            data = {"min_crops": info.crop_range[0], "max_crops": info.crop_range[1], **data}
        return data

    @model_validator(mode="after")
    def _check(self) -> "Workload":
        from .registry import mode_info

        if self.image_size is not None and min(self.image_size) <= 0:
            raise ValueError(f"image size must be positive, got {self.image_size[0]}x{self.image_size[1]}")
        if self.crops is not None and min(self.crops) <= 0:
            raise ValueError(f"crop grid must be positive, got {self.crops[0]}x{self.crops[1]}")
        if self.min_crops > self.max_crops:
            raise ValueError(f"min_crops {self.min_crops} > max_crops {self.max_crops}")
        if self.crops is not None and not mode_info(self.mode).crop_mode and self.crops != (1, 1):
            raise ValueError(f"mode {self.mode} does not tile; crops apply to crop modes only")
        return self

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]


class Hardware(_Frozen):
    """A GPU's ceilings. `peak_tflops` is dense BF16 tensor-core math (never the sparse figure)."""

    name: str
    peak_tflops: float = Field(gt=0)
    bandwidth_tbs: float = Field(gt=0)  # DRAM bandwidth, TB/s (10^12 bytes/s)
    memory_gb: float = Field(gt=0)  # 10^9 bytes
    source: str = ""  # datasheet reference, or "calibrated on <gpu> <date>"
    calibrated: bool = False

    @property
    def peak_flops(self) -> float:
        return self.peak_tflops * 1e12

    @property
    def bandwidth(self) -> float:
        return self.bandwidth_tbs * 1e12

    @property
    def ridge_intensity(self) -> float:
        """FLOPs per byte above which a kernel is compute bound on this GPU."""
        return self.peak_flops / self.bandwidth
