"""The model-family registry: every model the tool knows, with its stages, modes and tiling, presets and
checkpoint layout. CLI choices, the sidebar, charts, tables, exports and the run store read it; no other module
writes a list of stages, modes or presets.

DeepSeek-OCR (v1) and DeepSeek-OCR 2 share the MoE decoder and the SAM tokenizer; they differ in the second vision
stage (CLIP-L vs a Qwen2-shaped encoder with learnable queries), the projector input, the crop size and the slot
layout (v1 puts a newline slot after every feature row, v2 has none). Mode names are unique across families, so a
mode alone says which family's tiling it follows.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Mapping

from .spec import PRESETS as V1_PRESETS
from .spec import DecoderSpec, ModelSpec, SpecError
from .spec_v2 import PRESETS as V2_PRESETS
from .spec_v2 import OCR2Spec

DEFAULT_MODEL = "deepseek-ocr"
LM_STAGES = ("prefill", "decode")  # the decoder's stages, the same in every family
# the stages whose eager ops the reference plan prices at the host cost per op of the model's own code, measured by
# stage on the full-size model (calibration/host_stages.py); not the projector (a few ops and a stage's fixed
# Python) nor the LM prefill (its host cost per op grows with the tokens per expert): docs/accuracy.md
HOST_COST_STAGES = ("sam", "clip", "decode")


@dataclass(frozen=True)
class Stage:
    name: str  # key in analytic rows, measured stage rows, exports
    label: str  # display name
    vision: bool  # runs once per view (vision) or over the prompt/steps (LM)


@dataclass(frozen=True)
class ModeInfo:
    base_size: int  # global view side in pixels
    tile_size: int  # local tile side in pixels (crop modes)
    crop_mode: bool
    pad: bool  # global view padded (aspect kept) rather than resized directly
    newlines: bool = True  # one `image_newline` slot after every feature row (v1); v2 has none
    crop_range: tuple[int, int] = (2, 9)  # default min/max tiles the grid choice considers


@dataclass(frozen=True)
class CheckpointLayout:
    architecture: str  # config.json `architectures[0]`
    vision_model_name: str  # config.json `vision_config.model_name`
    tensors: int  # tensors of the official checkpoint (with the full preset)
    parameters: int  # parameters of the official checkpoint
    allowed_extra: frozenset[str] = frozenset()  # buffers some re-saved checkpoints carry, ignored on load


@dataclass(frozen=True)
class ModelFamily:
    name: str  # CLI `--model` value, stored with every run
    label: str
    stages: tuple[Stage, ...]  # in running order
    modes: Mapping[str, ModeInfo]
    default_mode: str
    presets: Mapping[str, Callable[[], DecoderSpec]]  # full (the official sizes), tiny (CPU tests)
    spec_class: type
    checkpoint: CheckpointLayout
    torch_model: str  # "module:Class" of our PyTorch model, imported only when a model is built
    analytic: str  # module of the vision stages' analytic rows: view_rows(), head_params(), STAGE_PREFIXES
    notes: tuple[str, ...] = field(default=())  # assumptions the figures rest on, shown where they are used
    fast_engine: bool = True  # the fast session mode (dsocr_core/fast) runs this model; else reference only

    @property
    def stage_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.stages)

    @property
    def vision_stages(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.stages if s.vision)

    @property
    def all_stages(self) -> tuple[str, ...]:
        """Stage totals in display order: the vision stages, their sum `vision`, the LM stages, `total`."""
        return (*self.vision_stages, "vision", *LM_STAGES, "total")

    def labels(self) -> dict[str, str]:
        return {s.name: s.label for s in self.stages} | {"vision": "vision", "total": "total"}

    def preset(self, name: str) -> DecoderSpec:
        try:
            return self.presets[name]()
        except KeyError:
            raise SpecError(f"unknown preset {name!r} for {self.name}; "
                            f"choose one of {', '.join(self.presets)}") from None

    def mode(self, name: str) -> ModeInfo:
        try:
            return self.modes[name]
        except KeyError:
            raise SpecError(f"mode {name!r} is not a {self.label} mode; "
                            f"choose one of {', '.join(self.modes)}") from None

    def load(self, what: str):
        """The object a "module[:name]" field of this entry points at (torch_model, analytic), imported now."""
        module, _, name = getattr(self, what).partition(":")
        loaded = importlib.import_module(module)
        return getattr(loaded, name) if name else loaded


_LM = (Stage("prefill", "LM prefill", False), Stage("decode", "LM decode", False))

FAMILIES: Mapping[str, ModelFamily] = MappingProxyType({
    "deepseek-ocr": ModelFamily(
        name="deepseek-ocr", label="DeepSeek-OCR",
        stages=(Stage("sam", "SAM", True), Stage("clip", "CLIP", True), Stage("projector", "projector", True), *_LM),
        modes=MappingProxyType({
            "tiny": ModeInfo(512, 512, False, False),
            "small": ModeInfo(640, 640, False, False),
            "base": ModeInfo(1024, 1024, False, True),
            "large": ModeInfo(1280, 1280, False, True),
            "gundam": ModeInfo(1024, 640, True, True),
            "gundam-m": ModeInfo(1280, 1024, True, True),
        }),
        default_mode="gundam", presets=MappingProxyType(dict(V1_PRESETS)), spec_class=ModelSpec,
        checkpoint=CheckpointLayout("DeepseekOCRForCausalLM", "deeplip_b_l", 2710, 3_336_106_240,
                                    frozenset({"model.vision_model.embeddings.position_ids"})),
        torch_model="dsocr_core.model.deepseek_ocr:DeepseekOCRForCausalLM",
        analytic="dsocr_core.analytic.vision",
    ),
    "deepseek-ocr2": ModelFamily(
        name="deepseek-ocr2", label="DeepSeek-OCR 2",
        stages=(Stage("sam", "SAM", True), Stage("encoder", "encoder", True), Stage("projector", "projector", True),
                *_LM),
        # the one shipped setting: 1024 global view padded, 768 crops, 2..6 of them, no newline slots
        modes=MappingProxyType({"dynamic": ModeInfo(1024, 768, True, True, newlines=False, crop_range=(2, 6))}),
        default_mode="dynamic", presets=MappingProxyType(dict(V2_PRESETS)), spec_class=OCR2Spec,
        checkpoint=CheckpointLayout("DeepseekOCR2ForCausalLM", "deepencoderv2", 2707, 3_389_119_360),
        torch_model="dsocr_core.model.deepseek_ocr2:DeepseekOCR2ForCausalLM",
        analytic="dsocr_core.analytic.encoder_v2",
        notes=("encoder positions 0..2n-1 (visual then queries), 1-D RoPE: transformers' default, assumed",),
        fast_engine=False,
    ),
})


def get_family(name: str | None = None) -> ModelFamily:
    """The registry entry of a model name (None: the default model). SpecError names the choices."""
    name = DEFAULT_MODEL if name is None else name
    try:
        return FAMILIES[name]
    except KeyError:
        raise SpecError(f"unknown model {name!r}; choose one of {', '.join(FAMILIES)}") from None


def family_of(spec: DecoderSpec) -> ModelFamily:
    """The entry a spec belongs to."""
    return get_family(type(spec).family)


class OfFamily:
    """`family` and `vision_stages` of anything holding a `spec` (a Session, a scaled-out run's RemoteSession)."""

    spec: DecoderSpec

    @property
    def family(self) -> ModelFamily:
        """The model family's registry entry (stages, modes, presets)."""
        return family_of(self.spec)

    @property
    def vision_stages(self) -> tuple[str, ...]:
        return self.family.vision_stages


def family_of_mode(mode: str) -> ModelFamily:
    for fam in FAMILIES.values():
        if mode in fam.modes:
            return fam
    raise SpecError(f"unknown mode {mode!r}; choose one of {', '.join(all_modes())}")


def mode_info(mode: str) -> ModeInfo:
    """The tiling of a mode of any family."""
    return family_of_mode(mode).modes[mode]


def vision_stage_names() -> tuple[str, ...]:
    """Every family's vision stages, each once, in running order (e.g. for telling prefill work from decode)."""
    names = {s for fam in FAMILIES.values() for s in fam.vision_stages}
    return tuple(sorted(names, key=lambda s: (stage_rank(s), s)))


def stage_names() -> tuple[str, ...]:
    """Every family's stages and the `vision` sum, each once, in display order (sam, clip, encoder, projector,
    vision, prefill, decode): the stage columns of stores, page tables and exports."""
    names = {s for fam in FAMILIES.values() for s in fam.all_stages if s != "total"}
    return tuple(sorted(names, key=lambda s: (stage_rank(s), s)))


def stage_labels() -> dict[str, str]:
    """Display name of every stage of every family (and of `vision`, `total`), in display order."""
    labels = {k: v for fam in FAMILIES.values() for k, v in fam.labels().items()}
    return {k: labels[k] for k in sorted(labels, key=lambda s: (stage_rank(s), s))}


def native_modes(model: str | None = None) -> tuple[str, ...]:
    """A family's modes without tiles (DeepSeek-OCR: tiny, small, base, large; DeepSeek-OCR 2: none)."""
    return tuple(m for m, info in get_family(model).modes.items() if not info.crop_mode)


def fast_engine_models() -> tuple[str, ...]:
    """Labels of the models the fast session mode runs."""
    return tuple(f.label for f in FAMILIES.values() if f.fast_engine)


def all_modes() -> tuple[str, ...]:
    return tuple(m for fam in FAMILIES.values() for m in fam.modes)


def stage_rank(stage: str) -> int:
    """Sort key of a stage name in running order (the same rank for the stages two families put in one place,
    e.g. clip and encoder); unknown names sort last."""
    for fam in FAMILIES.values():
        if stage in fam.all_stages:
            return fam.all_stages.index(stage)
    return 1 << 10


def read_spec(path) -> DecoderSpec:
    """The spec of a checkpoint folder's (or a config.json file's) config, in the family it names (no torch
    import: the sidebar checks a folder with it). Raises SpecError naming the problem."""
    from pathlib import Path

    from .spec import read_config_json

    path = Path(path)
    path = path / "config.json" if path.is_dir() else path
    try:
        raw = read_config_json(path)[1]  # size and depth bounded before parsing
    except SpecError:
        raw = None  # the family's reader reports the problem
    fam = family_of_config(raw) if isinstance(raw, dict) else get_family()
    return fam.spec_class.from_config_json(path)


def family_of_config(raw: dict) -> ModelFamily:
    """Which family a vendor config.json describes: by `architectures`, else by the vision model's name."""
    archs = raw.get("architectures") if isinstance(raw.get("architectures"), list) else []
    vision = raw.get("vision_config") if isinstance(raw.get("vision_config"), dict) else {}
    for fam in FAMILIES.values():
        if fam.checkpoint.architecture in archs or vision.get("model_name") == fam.checkpoint.vision_model_name:
            return fam
    return get_family(DEFAULT_MODEL)  # older v1 configs name neither
