"""The engine registry: which engines (session modes) exist, and the one validated description of an engine.

An `EngineSpec` is an engine's kind plus its options, validated against that kind's options model; it is
torch-free (the dashboard's sidebar reads the registry without importing torch). From it:
* the runtime engine is built (`runtime.engine.build_engine(spec, model)`);
* every run stores it (`Session.describe()["engine_spec"]`, so in each run's `meta.session`);
* the kernel plan the time model prices is derived (`spec.kernel_plan(device_kind)`), by the plan module that
  sits beside the engine's code (`runtime/reference_plan.py`, `fast/plan.py`) and reads the real options.

The CLI's `--session-mode` choices and the sidebar's session modes are `ENGINES`' keys. Adding an engine is one
entry here plus its options model, its engine class and its plan module (and their tests).
"""
from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, ValidationError

from .spec import SpecError


@dataclass(frozen=True)
class EngineKind:
    name: str
    title: str  # what the sidebar shows
    help: str  # one sentence: what the engine is, what it needs
    needs_cuda: bool  # the sidebar offers it only with a CUDA device (the CLI predicts it anywhere)
    options: str  # "module:Class", the pydantic model of the engine's options (torch-free)
    engine: str  # "module:Class", the runtime engine, built as Class(model, **options)
    plan: str  # "module:Class", the kernel plan, built as Class(resolved options, device_kind)


ENGINES: dict[str, EngineKind] = {
    "reference": EngineKind(
        "reference", "Reference",
        "the plain PyTorch model with HF generate() semantics (eager kernels, a Python loop over the experts)",
        False, "dsocr_core.runtime.reference_plan:ReferenceOptions", "dsocr_core.runtime.engine:ReferenceEngine",
        "dsocr_core.runtime.reference_plan:ReferencePlan"),
    "fast": EngineKind(
        "fast", "Fast",
        "the fast engine (static KV cache, CUDA graphs, fused Triton decode kernels at batch 1, Triton routing and "
        "by-expert MoE kernels at batch 2-64); it needs a CUDA GPU",
        True, "dsocr_core.fast.options:FastOptions", "dsocr_core.fast.engine:FastEngine",
        "dsocr_core.fast.plan:FastPlan"),
}
SESSION_MODES = tuple(ENGINES)
DEVICE_KINDS = ("cuda", "cpu")


def load(ref: str):
    """The object a "module:attr" reference names (imported on first use: engines import torch)."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def engine_kind(kind: str) -> EngineKind:
    if kind not in ENGINES:
        raise SpecError(f"session_mode must be one of {', '.join(ENGINES)}, got {kind!r}")
    return ENGINES[kind]


class EngineSpec(BaseModel):
    """One engine: its kind (a session mode) and its options, validated by the kind's options model. `options`
    holds every option (defaults filled in), so two descriptions of the same engine compare equal."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str
    options: dict[str, Any]

    @classmethod
    def of(cls, kind: str, options: Mapping[str, Any] | None = None) -> "EngineSpec":
        """The validated description of engine `kind` with `options` (unknown or malformed options raise a
        SpecError naming them)."""
        model = load(engine_kind(kind).options)
        if options and not model.model_fields:
            raise SpecError(f"the {kind} engine takes no options, got {sorted(options)}")
        try:
            opts = model(**dict(options or {}))
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'options'}: {e['msg']}" for e in exc.errors())
            raise SpecError(f"{kind} engine options: {problems}") from None
        return cls(kind=kind, options=opts.model_dump(mode="json"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "EngineSpec":
        """An engine description read back from a file or a run (validated again)."""
        if not isinstance(data, Mapping) or "kind" not in data:
            raise SpecError(f"an engine description needs 'kind' and 'options', got {data!r:.200}")
        extra = set(data) - {"kind", "options"}
        if extra:
            raise SpecError(f"unknown engine description fields {sorted(extra)}")
        options = data.get("options")
        upgrade = getattr(load(engine_kind(data["kind"]).options), "from_stored", None)  # options added later
        if upgrade is not None and isinstance(options, Mapping):
            options = upgrade(dict(options))
        return cls.of(data["kind"], options)

    def validated(self):
        """The options as the kind's options model."""
        return load(engine_kind(self.kind).options)(**self.options)

    def non_default(self) -> dict[str, Any]:
        """The options that differ from the kind's defaults."""
        defaults = load(engine_kind(self.kind).options)().model_dump(mode="json")
        return {k: v for k, v in self.options.items() if defaults.get(k) != v}

    def label(self) -> str:
        """'fast' or 'fast (bucket=128, fused=False)': the kind and any non-default option."""
        changed = self.non_default()
        if not changed:
            return self.kind
        return f"{self.kind} ({', '.join(f'{k}={json.dumps(v)}' for k, v in sorted(changed.items()))})"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "options": dict(self.options)}

    def build(self, model):
        """The runtime engine over `model` (imports torch)."""
        return load(engine_kind(self.kind).engine)(model, **self.validated().model_dump())

    def kernel_plan(self, device_kind: str):
        """The kernel plan of this engine on a device of `device_kind` (cuda | cpu): what the time model prices.
        Options left to the device ("auto", None) are resolved as the engine resolves them there."""
        if device_kind not in DEVICE_KINDS:
            raise SpecError(f"device kind must be one of {', '.join(DEVICE_KINDS)}, got {device_kind!r}")
        options = self.validated()
        return load(engine_kind(self.kind).plan)(options.resolved(device_kind), device_kind)


def as_engine(engine: "EngineSpec | str | Mapping[str, Any]") -> EngineSpec:
    """An EngineSpec from a description, a stored dict, or a bare kind (its default options)."""
    if isinstance(engine, EngineSpec):
        return engine
    if isinstance(engine, str):
        return EngineSpec.of(engine)
    return EngineSpec.from_dict(engine)


def parse_options(text: str | None, flag: str = "--engine-options") -> dict[str, Any]:
    """Engine options typed on a command line: a JSON object ('{"bucket": 128, "fused": false}')."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"{flag}: not JSON ({exc.msg} at character {exc.pos}): {text!r:.100}") from None
    if not isinstance(value, dict):
        raise SpecError(f"{flag}: give a JSON object of option names and values, got {text!r:.100}")
    return value


def options_help() -> str:
    """What --engine-options accepts, per engine kind (for the CLI's help)."""
    parts = []
    for kind in ENGINES.values():
        fields = load(kind.options).model_fields
        parts.append(f"{kind.name}: {', '.join(fields) if fields else 'none'}")
    return "engine options as a JSON object (" + "; ".join(parts) + ")"


# What a fast engine ran before runs and accuracy results recorded their engine (2026-11-26): batched decode on the
# grouped GEMMs (gather_max_rows 8, the default of the time), the projector laying each image out with the
# reference's cats (projector_layout 'per_image', the only layout then), Inductor's MoE rows (moe_rows 'torch'), the
# batched decode's router GEMM and combine as kernels of their own (expert_fusion 'separate'), the batched greedy
# choice on the host (batched_choice 'host')
ENGINE_BEFORE_RECORDS = {"fast": {"kind": "fast", "options": {"gather_max_rows": 8, "projector_layout": "per_image",
                                                              "moe_rows": "torch", "expert_fusion": "separate",
                                                              "batched_choice": "host"}}}


def engine_before_records(session_mode: str) -> EngineSpec:
    """The engine a session mode ran before engine descriptions were recorded (its defaults where nothing of
    note has changed since)."""
    return EngineSpec.from_dict(ENGINE_BEFORE_RECORDS.get(session_mode, {"kind": session_mode, "options": {}}))


def run_engine(run: Mapping[str, Any]) -> tuple[EngineSpec, bool]:
    """(the engine a stored run was measured with, whether that is recorded). Runs stored before engine
    descriptions existed carry only their session mode: their engine is that mode's engine of the time
    (engine_before_records; False)."""
    session = ((run.get("meta") or {}).get("session") or {})
    stored = session.get("engine_spec")
    if stored is not None:
        return EngineSpec.from_dict(stored), True
    return engine_before_records(run.get("session_mode") or "reference"), False
