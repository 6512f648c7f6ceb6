"""The fast engine's options: one validated, torch-free model (engine.FastEngine takes exactly these keyword
arguments, with the same defaults; tests/test_engines.py checks the two agree), and their resolution on a device
kind, which is what the kernel plan (fast/plan.py) reads.

`resolved(device_kind)` follows FastEngine.__init__: on a CUDA device graphs, compile and (with Triton, which
the plan assumes on CUDA) the fused batch-1 decode step are on unless turned off; on a CPU everything runs
eagerly, and options that need CUDA are refused with the engine's own reason.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from pydantic import BaseModel, ConfigDict, Field

from ..spec import SpecError

DEFAULT_NEW_TOKENS = 1024  # cache room a bare prefill leaves for decoding (engine.DEFAULT_NEW_TOKENS)


# every option a stored description held before projector_layout existed (frozen: later options must not move it)
OPTIONS_BEFORE_PROJECTOR_LAYOUT = frozenset({
    "compile", "graphs", "moe", "attention", "bucket", "gather_max_rows", "sam_attention", "compile_vision",
    "compile_prefill", "clip_packed", "topk", "cudnn_benchmark", "compile_options", "fused", "fused_blocks", "pdl",
    "graph_steps", "min_room"})


class FastOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    compile: bool | None = None  # torch.compile the decode step's pieces (None: on a GPU)
    graphs: bool | None = None  # CUDA graphs (None: on a GPU)
    moe: Literal["auto", "triton", "gather", "grouped"] = "auto"  # decode experts outside the fused step
    attention: Literal["auto", "triton", "reduce", "sdpa"] = "auto"  # decode attention outside the fused step
    bucket: int = Field(256, ge=1)  # static-cache length bucket: decode attends over a multiple of it
    # (named for the gather kernels it once chose) decode experts by Triton's routing and by-expert kernels up to
    # this many (token, slot) rows and BY_EXPERT_MAX_TOKENS rows, grouped GEMMs above; 512 =
    # batch 64, the largest batch benchmarks/moe_decode.py measured them faster at (every batch 2-64, on an H100).
    # Runs measured before 2026-11-26 ran with 8 (batch 1 only)
    gather_max_rows: int = Field(512, ge=0)
    sam_attention: Literal["auto", "flex", "fold", "dense"] = "auto"
    compile_vision: bool | None = None
    compile_prefill: bool | None = None
    clip_packed: bool = True  # every view group's CLIP rows through each layer at once
    # how the projector lays the images' features out in their slots: 'gather', one gather of every slot from the
    # projected rows and the layout vectors (fast/vision.run_projector); 'per_image', the reference's loop of cats
    # per image, which every run measured before this option existed ran
    projector_layout: Literal["gather", "per_image"] = "gather"
    # the grouped MoE's grouping, copy into expert order and weighted combine + residual (prefill, and decode above
    # the by-expert kernels): 'triton', fast/moe_rows.py's kernels; 'torch', the formulation Inductor compiles, which
    # every run measured before this option existed ran ('auto': Triton's on a GPU)
    moe_rows: Literal["auto", "torch", "triton"] = "auto"
    # batched decode's by-expert MoE (batch 2-64): 'fused', the router GEMM inside the routing kernel and the weighted
    # combine + residual inside the down kernel (three launches after the norm: routing, gate/up, down); 'separate',
    # the router GEMM and its split-K reduction compiled with the step, a routing kernel, gate/up, down and
    # Inductor's combine (six), which every run measured before this option existed ran ('auto': 'fused' on a GPU)
    expert_fusion: Literal["auto", "fused", "separate"] = "auto"
    # the greedy choice of a decode step outside the fused batch-1 step: 'graph', fast/choice_kernels.py's three
    # kernels inside the step's graph; 'host', next_tokens' eager ops between graph replays (about fifteen launches
    # a step), which every run measured before this option existed ran ('auto': 'graph' on a GPU)
    batched_choice: Literal["auto", "host", "graph"] = "auto"
    topk: Literal["auto", "argmax", "torch"] = "auto"
    cudnn_benchmark: bool = True
    compile_options: dict | None = None
    fused: bool | None = None  # the fused batch-1 decode step (None: with Triton on a GPU)
    fused_blocks: dict | None = None
    pdl: bool | None = None  # programmatic dependent launch between the fused kernels (sm90+)
    graph_steps: int = Field(2, ge=1)  # fused batch-1 generation: decode steps per graph replay
    min_room: int = Field(DEFAULT_NEW_TOKENS, ge=0)

    @classmethod
    def from_stored(cls, options: dict) -> dict:
        """Options read back from a stored engine description. EngineSpec.to_dict writes every option of its
        time, so a description holding every option of the set before projector_layout existed but not a later
        option was written before that option existed: it gets what the engine did then ('per_image' layout,
        torch's MoE rows, the batched decode's router GEMM and combine as kernels of their own, its greedy choice on
        the host), not today's default."""
        if OPTIONS_BEFORE_PROJECTOR_LAYOUT <= set(options):  # a whole description: options added since are theirs
            before = {"projector_layout": "per_image", "moe_rows": "torch", "expert_fusion": "separate",
                      "batched_choice": "host"}
            return {**{k: v for k, v in before.items() if k not in options}, **options}
        return options

    def resolved(self, device_kind: str) -> "ResolvedFast":
        cuda = device_kind == "cuda"
        triton = cuda  # Triton ships with torch's CUDA builds; the engine checks it where it runs
        if self.fused and not triton:
            raise SpecError("fast engine option fused: the fused decode step needs a CUDA device and Triton")
        if self.attention == "triton" and not triton:
            raise SpecError("fast engine option attention: 'triton' needs a CUDA device and Triton")
        if self.moe == "triton" and not triton:
            raise SpecError("fast engine option moe: 'triton' needs a CUDA device and Triton")
        for name, (with_triton, _) in TRITON_CHOICES.items():
            if getattr(self, name) == with_triton and not triton:
                raise SpecError(f"fast engine option {name}: {with_triton!r} needs a CUDA device and Triton")
        compile_ = cuda if self.compile is None else self.compile
        attention = self.attention
        if attention == "auto":
            attention = "triton" if triton else ("sdpa" if cuda else "reduce")
        return ResolvedFast(
            graphs=cuda if self.graphs is None else bool(self.graphs and cuda),
            compile=compile_,
            compile_vision=compile_ if self.compile_vision is None else self.compile_vision,
            compile_prefill=compile_ if self.compile_prefill is None else self.compile_prefill,
            fused=triton if self.fused is None else self.fused,
            attention=attention, moe=self.moe, gather_max_rows=self.gather_max_rows,
            sam_attention="fold" if self.sam_attention == "auto" else self.sam_attention,
            clip_packed=self.clip_packed, bucket=self.bucket, graph_steps=self.graph_steps, cuda=cuda,
            projector_layout=self.projector_layout,
            **{name: resolve_auto(name, getattr(self, name), triton) for name in TRITON_CHOICES})


# options whose 'auto' is one value with Triton on a GPU and another elsewhere: (with Triton, without); the first
# needs Triton. FastOptions.resolved and FastEngine resolve them with resolve_auto, so the plan and the engine agree
TRITON_CHOICES = {"moe_rows": ("triton", "torch"), "expert_fusion": ("fused", "separate"),
                  "batched_choice": ("graph", "host")}


def resolve_auto(option: str, value: str, triton: bool) -> str:
    """`value` of one of TRITON_CHOICES' options, 'auto' resolved for a device with or without Triton."""
    with_triton, without = TRITON_CHOICES[option]
    return (with_triton if triton else without) if value == "auto" else value


# the by-expert Triton kernels hold one expert's rows of every token in a [rows, tokens] tile: up to 64 tokens
# (beyond that the tile would spill registers and outgrow shared memory; they were measured up to batch 64)
BY_EXPERT_MAX_TOKENS = 64


def expert_token_tile(tokens):
    """The token side of the by-expert kernels' [rows, tokens] tile (triton_kernels.moe_gemv): the batch rounded up
    to a power of two, 16 at least (tl.dot's smallest side). Every program loads and multiplies the whole tile,
    so the kernels' time follows it, not the batch: the plan looks their table up at it. Numbers or arrays."""
    t = np.maximum(np.asarray(tokens, dtype=float), 1.0)
    tile = np.maximum(16.0, 2.0 ** np.ceil(np.log2(t)))
    return int(tile) if np.ndim(tile) == 0 else tile


def expert_lanes(n_experts: int) -> int:
    """The lanes moe_rows.group_rows compares each (token, slot) row with, one per expert: n_experts rounded up to
    a power of two, 16 at least (its one-hot tile's width). The kernel plan prices the grouping by this work."""
    return max(16, 1 << (n_experts - 1).bit_length())


def decode_moe(moe: str, batch: int, slots: int, gather_max_rows: int, cuda: bool, triton: bool) -> str:
    """The experts' kernels of a decode step at `batch` outside the fused batch-1 step, as FastEngine.moe_impl
    runs them and the kernel plan prices them: an explicit `moe` option, else on a CPU the gather path, else
    Triton's by-expert kernels while batch x slots (routed + shared experts per token) <= gather_max_rows (and
    the batch <= BY_EXPERT_MAX_TOKENS), and the grouped GEMMs above that. An explicit 'triton' above
    BY_EXPERT_MAX_TOKENS is refused (SpecError)."""
    if moe == "triton" and batch > BY_EXPERT_MAX_TOKENS:
        raise SpecError(f"fast engine option moe='triton' runs decode batches of up to {BY_EXPERT_MAX_TOKENS} rows "
                        f"(its per-expert token tile), got batch {batch}: use 'auto' or 'grouped'")
    if moe != "auto":
        return moe
    if not cuda:
        return "gather"
    fits = batch * slots <= gather_max_rows and batch <= BY_EXPERT_MAX_TOKENS
    return "triton" if triton and fits else "grouped"


@dataclass(frozen=True)
class ResolvedFast:
    """The fast engine's options on one device kind, as FastEngine.describe() reports them."""

    graphs: bool
    compile: bool
    compile_vision: bool
    compile_prefill: bool
    fused: bool
    attention: str
    moe: str
    gather_max_rows: int
    sam_attention: str
    clip_packed: bool
    bucket: int
    graph_steps: int
    cuda: bool = False
    projector_layout: str = "gather"
    moe_rows: str = "torch"
    expert_fusion: str = "separate"
    batched_choice: str = "host"

    def decode_moe(self, batch, slots: int) -> str:
        """decode_moe for this engine (Triton is assumed wherever CUDA is, as the plan assumes)."""
        return decode_moe(self.moe, batch, slots, self.gather_max_rows, self.cuda, self.cuda)
