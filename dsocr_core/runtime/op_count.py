"""What the reference engine really dispatches: every aten op our eager model issues, counted per analytic row
and split into kernel-launching ops, metadata-only ops, allocations and host synchronisations.

The time model prices each eager op's host cost (analytic/predict.py: the profile's cost of the op's kind,
analytic/kernels.py host_ops_by_kind) from the counts the reference plan writes (runtime/reference_plan.py). This
module counts the real ones, so the plan is checked against the model (tests/test_reference_plan_ops.py) and the
host term's size judged.

Counting runs the ReferenceEngine itself (prefill, one greedy decode step) under a TorchDispatchMode, with
torch.no_grad() as the engine runs it, so the ops seen are those below autograd: composite ops (linear, reshape,
to) arrive decomposed into what really runs (addmm or mm, view or a copy, _to_copy). Each op is charged to the
innermost module that one analytic row names (Row.paths); an op issued by a parent module around its children
(SAM's window partition, the residual adds, RoPE tables, the expert loop) is charged to a `glue` label of that
parent, since which row the plan files it under is the plan's choice. Host syncs are also caught at the Python
level (tolist, item, int(), bool() of a tensor), which a CPU tensor resolves without dispatching any op.

Counts are of a CPU run. On CUDA the same Python code issues the same aten ops, except inside composite
operators whose decomposition depends on the backend (SDPA's choice of kernel and its mask padding); the caller
states those differences.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ..analytic.kernels import Call, host_ops_by_kind

LAUNCH, METADATA, ALLOC, SYNC = "launch", "metadata", "alloc", "sync"
CATEGORIES = (LAUNCH, METADATA, ALLOC, SYNC)

# ops that only make a new view of existing storage (no kernel, no memory traffic)
METADATA_OPS = frozenset({
    "view", "_unsafe_view", "_reshape_alias", "reshape", "permute", "transpose", "t", "expand", "expand_as",
    "slice", "select", "as_strided", "unsqueeze", "squeeze", "detach", "alias", "split", "split_with_sizes",
    "unbind", "chunk", "narrow", "unfold", "diagonal", "view_as", "lift_fresh", "resolve_conj", "resolve_neg",
    "_nested_view_from_buffer", "_conj", "_neg_view", "flatten", "movedim", "contiguous_view",
})
# ops that allocate memory without writing it (the caching allocator, no kernel)
ALLOC_OPS = frozenset({"empty", "empty_strided", "new_empty", "new_empty_strided", "empty_like"})
# ops that wait for the device and copy a value to the host
SYNC_OPS = frozenset({"item", "_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2",
                      "repeat_interleave_sync"})
# Python-level tensor methods that read values on the host (a CPU tensor needs no aten op for them)
SYNC_METHODS = frozenset({"tolist", "item", "__int__", "__float__", "__bool__", "__index__"})

# Python-level reads of a tensor's metadata (shape, dtype, device): no op is dispatched
ATTRIBUTE_READS = frozenset({"__get__", "size", "dim", "numel", "element_size", "is_floating_point", "stride",
                             "data_ptr", "is_contiguous"})


def op_name(func) -> str:
    """aten.view.default -> 'view'."""
    return func.overloadpacket.__name__


def category(name: str) -> str:
    if name in SYNC_OPS:
        return SYNC
    if name in METADATA_OPS:
        return METADATA
    if name in ALLOC_OPS:
        return ALLOC
    return LAUNCH


@dataclass
class OpTally:
    """Aten ops per (stage, label): their names and counts, and the Python-level host syncs."""

    ops: dict[tuple[str, str], Counter] = field(default_factory=lambda: defaultdict(Counter))
    syncs: dict[tuple[str, str], Counter] = field(default_factory=lambda: defaultdict(Counter))
    # Python-level torch calls (functions, tensor methods and operators, attribute reads excluded): the unit the
    # calibration's host costs are measured in (one eager call of an op, calibration/ops.py host_mixes)
    calls: dict[tuple[str, str], Counter] = field(default_factory=lambda: defaultdict(Counter))

    def count(self, stage: str, label: str, cat: str | None = None) -> int:
        """Ops of one category (None: all aten ops) under `label` (or every label starting with `label.`)."""
        return sum(n for (st, lb), c in self.ops.items() if st == stage and _under(lb, label)
                   for name, n in c.items() if cat is None or category(name) == cat)

    def stage_count(self, stage: str, cat: str | None = None) -> int:
        """Ops of one category (None: all aten ops) in `stage`, every label."""
        return sum(n for (st, _), c in self.ops.items() if st == stage
                   for name, n in c.items() if cat is None or category(name) == cat)

    def python_calls(self, stage: str, label: str) -> int:
        return sum(sum(c.values()) for (st, lb), c in self.calls.items() if st == stage and _under(lb, label))

    def host_syncs(self, stage: str, label: str) -> int:
        """Host syncs: tolist / item / int() at the Python level (aten item ops included there)."""
        return sum(sum(c.values()) for (st, lb), c in self.syncs.items() if st == stage and _under(lb, label))

    def names(self, stage: str, label: str, cat: str) -> Counter:
        out = Counter()
        for (st, lb), c in self.ops.items():
            if st == stage and _under(lb, label):
                out.update({name: n for name, n in c.items() if category(name) == cat})
        return out

    def labels(self, stage: str) -> list[str]:
        return sorted({lb for st, lb in (*self.ops, *self.syncs, *self.calls) if st == stage})


def _under(label: str, prefix: str) -> bool:
    return prefix == "" or label == prefix or label.startswith(prefix + ".")


class _Where:
    """The stage and the innermost labelled module being run."""

    def __init__(self):
        self.stage = "none"
        self.labels: list[str] = []

    @property
    def label(self) -> str:
        return self.labels[-1] if self.labels else "outside"

    def enter(self, label: str) -> None:  # hooks must return None (a forward hook's value replaces the output)
        self.labels.append(label)

    def leave(self) -> None:
        self.labels.pop()


class _DispatchCounter(TorchDispatchMode):
    def __init__(self, where: _Where, tally: OpTally):
        super().__init__()
        self.where, self.tally = where, tally

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.tally.ops[(self.where.stage, self.where.label)][op_name(func)] += 1
        return func(*args, **(kwargs or {}))


class _SyncCounter(TorchFunctionMode):
    def __init__(self, where: _Where, tally: OpTally):
        super().__init__()
        self.where, self.tally = where, tally

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name not in ATTRIBUTE_READS:
            self.tally.calls[(self.where.stage, self.where.label)][name] += 1
        if name in SYNC_METHODS:
            self.tally.syncs[(self.where.stage, self.where.label)][name] += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def labelled(modules: dict[torch.nn.Module, str], where: _Where):
    """Push a module's label while its forward runs (innermost labelled module wins)."""
    handles = []
    for mod, label in modules.items():
        handles.append(mod.register_forward_pre_hook(lambda m, a, label=label: where.enter(label)))
        handles.append(mod.register_forward_hook(lambda m, a, o: where.leave()))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def row_labels(model: torch.nn.Module, row_paths: dict[str, tuple[str, ...]]) -> dict[torch.nn.Module, str]:
    """Module -> label: the analytic row kind for the modules the rows name (a path naming a parameter or a
    ModuleList labels nothing: its work is done by the parent's code), `<kind>.glue` labels for the parents that
    issue ops around them (a SAM or CLIP block, a decoder layer, the MoE, the encoders)."""
    mods = dict(model.named_modules())
    out: dict[torch.nn.Module, str] = {}
    for kind, paths in row_paths.items():
        for path in paths:
            mod = mods.get(path)
            if mod is not None and type(mod).forward is not torch.nn.Module.forward:
                out[mod] = kind
    for path, mod in mods.items():
        if mod not in out:
            glue = _glue_label(path, mod)
            if glue is not None:
                out[mod] = glue
    return out


def _glue_label(path: str, mod: torch.nn.Module) -> str | None:
    name = type(mod).__name__
    if name == "SamBlock":
        return f"sam.block.{'windowed' if mod.window else 'global'}.glue"
    if name == "ClipLayer":
        return "clip.layer.glue"
    if name == "DecoderLayer":
        return f"lm.layer.{'moe' if type(mod.mlp).__name__ == 'MoE' else 'dense'}.glue"
    if name == "MoE":
        return "lm.mlp.experts"  # the expert loop, the residual of y + shared: the MoE's own code
    if name in ("SamEncoder", "ClipEncoder", "ClipTransformer"):
        return f"{'sam' if name == 'SamEncoder' else 'clip'}.glue"
    return None


class _StageTimer:
    """The engine's timer stand-in: it only says which stage runs."""

    def __init__(self, where: _Where):
        self.where = where
        self.current = None

    @contextmanager
    def stage(self, name: str, track_memory: bool = False, count: int = 1):
        outer, self.where.stage = self.where.stage, name
        try:
            yield None
        finally:
            self.where.stage = outer


@contextmanager
def counting(model: torch.nn.Module, row_paths: dict[str, tuple[str, ...]]):
    """Yields (tally, timer, where): every aten op dispatched inside is counted under the current stage (set by
    `timer.stage(name)`, as the engine's StageTimer is) and label."""
    where, tally = _Where(), OpTally()
    with labelled(row_labels(model, row_paths), where), _SyncCounter(where, tally), _DispatchCounter(where, tally):
        yield tally, _StageTimer(where), where


def run_reference(engine, inputs, timer, decode_steps: int, ngram: int = 20) -> None:
    """One prefill (stages sam, clip, projector, prefill: the model's vision and LM code as the engine runs it,
    each under `timer.stage`), the first token's choice (stage `first_token`) and `decode_steps` greedy decode steps
    (stage `decode`: the model step plus the token choice). What the op counter counts and the host-cost
    calibration (calibration/host_stages.py) times."""
    logits, cache = engine.prefill(inputs, logits="last", timer=timer, room=decode_steps + 1)
    with timer.stage("first_token"):
        finished = torch.zeros(inputs.input_ids.shape[0], dtype=torch.bool, device=inputs.input_ids.device)
        token = logits[:, -1].argmax(-1)
    for _ in range(decode_steps):
        with timer.stage("decode"):
            token = engine.greedy(cache, token, 1, ngram, finished)[:, 0]


def count_reference_run(engine, inputs, row_paths: dict[str, tuple[str, ...]], decode_steps: int = 1,
                        ngram: int = 20) -> OpTally:
    """Counts of run_reference's stages."""
    with torch.no_grad(), counting(engine.model, row_paths) as (tally, timer, where):
        run_reference(engine, inputs, timer, decode_steps, ngram)
        where.stage = "none"
    return tally


# ------------------------------------------------------------------------------------------ plan vs model
@dataclass(frozen=True)
class FixedRouting:
    """A routing that touches `experts` distinct experts per MoE call: the count a counted run really saw, so the
    plan is compared at the same routing (the plan's own default is the uniform expectation)."""

    experts: float

    def touched(self, n_experts: int, k: int, tokens):
        return np.full(np.shape(tokens), float(self.experts))

    def rows_by_rank(self, n_experts: int, k: int, tokens):
        return None  # a count only: no loads (the plan's launch counts do not depend on them)


@dataclass
class PlannedOps:
    # kernel-launching ops dispatched: the plan's kernels' launches (but those another op launches inside itself)
    # and rest_launches
    launches: float = 0.0
    host_ops: float = 0.0  # eager host ops the time model prices, every kind (kernels.host_ops_by_kind summed)
    syncs: float = 0.0
    views: float = 0.0  # metadata-only ops the plan prices (its view_ops)


def planned_ops(plan, row, routing=None) -> PlannedOps:
    """What the plan says one row issues: every call part of the row, times the row's module count."""
    out = PlannedOps()
    parts = row.parts or (row.cost,)
    for part, ctx in zip(parts, row.ctx):
        pl = plan.plan(Call(row.kind, part, ctx, routing=routing))
        # a kernel another op launches inside itself (host_ops 0: the LayerNorm's copy of a permuted input) is no
        # dispatched op of its own
        launches = sum(_num(k.launches if k.host_ops is None else k.host_ops) for k in pl.kernels) + _num(
            pl.rest_launches)
        out.launches += row.count * launches
        out.host_ops += row.count * sum(_num(n) for n in host_ops_by_kind(pl, False).values())
        out.syncs += row.count * _num(pl.syncs)
        out.views += row.count * _num(pl.view_ops)
    return out


def _num(x) -> float:
    return float(np.sum(x))


# which comparison group an analytic row kind or a counted label belongs to: the plan files glue ops (a block's
# residual adds, the window partition) under one of the block's rows, so rows compare exactly only as a block
def group_of(stage: str, label: str) -> str:
    if label.startswith(_BLOCK_ROWS):
        return f"sam.block.{label.rsplit('.', 1)[1]}"
    for prefix, group in _GROUPS:
        if label.startswith(prefix):
            return group
    if stage == "projector":
        return "projector"  # the projector, the features' concatenation and the slot layout
    if stage == "encoder":  # DeepSeek-OCR 2's encoder: its per-call setup (the mask, the RoPE tables, the query
        return "encoder"  # concatenation) runs outside the rows' modules; the plan files it under the queries' rows
    if stage in ("prefill", "decode"):
        return "lm.outside_layers"  # embedding, positions and RoPE tables, final norm, lm_head, token choice
    return label


_GROUPS = (
    ("sam.block.windowed", "sam.block.windowed"), ("sam.block.global", "sam.block.global"),
    ("sam.patch_embed", "sam.embed"), ("sam.pos_embed", "sam.embed"), ("sam.glue", "sam.embed"),
    ("clip.layer", "clip.layer"), ("clip.self_attn", "clip.layer"), ("clip.mlp", "clip.layer"),
    ("lm.input_layernorm", "lm.layers"), ("lm.self_attn", "lm.layers"), ("lm.post_attention_layernorm", "lm.layers"),
    ("lm.mlp", "lm.layers"), ("lm.layer", "lm.layers"),
)
_BLOCK_ROWS = ("sam.norm1.", "sam.attn.", "sam.norm2.", "sam.mlp.")


@dataclass
class Comparison:
    """One stage's group: the plan's counts against the counted ones."""

    stage: str
    group: str
    planned: PlannedOps = field(default_factory=PlannedOps)
    launch: int = 0  # kernel-launching aten ops counted
    metadata: int = 0  # view-only aten ops counted
    alloc: int = 0  # allocations without a kernel
    syncs: int = 0  # host synchronisations (Python-level reads of device values, sync-only aten ops)
    names: Counter = field(default_factory=Counter)  # the launching ops by name
    python_calls: int = 0  # Python-level torch calls (the unit host_op_s was measured in)

    @property
    def aten_ops(self) -> int:
        return self.launch + self.metadata + self.alloc


def compare(tally: OpTally, rows_by_stage: dict[str, list], plan, routing_by_stage: dict | None = None
            ) -> list[Comparison]:
    """Per stage and group, the plan's counts for `rows_by_stage[stage]` against `tally` (the same workload)."""
    out: dict[tuple[str, str], Comparison] = {}
    routing_by_stage = routing_by_stage or {}

    def entry(stage, group):
        return out.setdefault((stage, group), Comparison(stage, group))

    for stage, rows in rows_by_stage.items():
        for row in rows:
            p = planned_ops(plan, row, routing_by_stage.get(stage))
            e = entry(stage, group_of(stage, row.kind))
            e.planned.launches += p.launches
            e.planned.host_ops += p.host_ops
            e.planned.syncs += p.syncs
            e.planned.views += p.views
        for label in tally.labels(stage):
            e = entry(stage, group_of(stage, label))
            e.launch += tally.count(stage, label, LAUNCH)
            e.metadata += tally.count(stage, label, METADATA)
            e.alloc += tally.count(stage, label, ALLOC)
            e.syncs += tally.host_syncs(stage, label) + sum(
                n for name, n in tally.names(stage, label, SYNC).items() if name not in _READ_OPS)
            e.names.update(tally.names(stage, label, LAUNCH))
            e.python_calls += tally.python_calls(stage, label)
    return list(out.values())


_READ_OPS = ("item", "_local_scalar_dense")  # already counted as the Python-level read that issued them


def compare_workload(model, plan, mode: str = "gundam", grid: tuple[int, int] = (1, 1), batch: int = 1,
                     text_tokens: int = 10, ngram: int = 20) -> list[Comparison]:
    """Run the reference engine over `model` on synthetic inputs of one workload (a prefill, one decode step) and
    compare what it dispatched with what `plan` says for the same rows. The plan is asked at the routing the run
    had (distinct experts per MoE call, counted), so only the per-expert and fixed counts are compared."""
    from ..analytic.points import Points
    from .engine import ReferenceEngine
    from .inputs import synthetic_inputs

    spec, dtype = model.spec, model.lm_head.weight.dtype
    pts = Points.build(mode=mode, crops=grid, text_tokens=text_tokens, batch=batch, decode_steps=1,
                       dtype=str(dtype).removeprefix("torch."), attn=model.attn_impl, logits="last")
    rows = workload_rows(spec, pts, decode_steps=1)
    paths = {row.kind: tuple(row.paths) for stage_rows in rows.values() for row in stage_rows}
    inputs = synthetic_inputs(mode, grid, text_tokens, batch, dtype=dtype)
    with expert_calls(model) as experts:
        tally = count_reference_run(ReferenceEngine(model), inputs, paths, decode_steps=1, ngram=ngram)
    return compare(tally, rows, plan, observed_routing(model, experts, decode_steps=1))


def workload_rows(spec, pts, decode_steps: int) -> dict[str, list]:
    """Analytic rows per stage of a run: the vision stages, the prefill, and each decode step at its own context
    (step i has sequence + i tokens cached)."""
    from ..analytic.stages import decode_step_rows, prefill_rows, vision_rows

    rows: dict[str, list] = defaultdict(list)
    for row in vision_rows(spec, pts):
        rows[row.stage].append(row)
    rows["prefill"] = list(prefill_rows(spec, pts))
    for step in range(decode_steps):
        rows["decode"] += decode_step_rows(spec, pts, pts.sequence + step)
    return dict(rows)


def observed_routing(model, experts: Counter, decode_steps: int) -> dict[str, "FixedRouting"]:
    """Distinct experts per MoE call a run saw (expert_calls' counts), per stage (each decode step calls every MoE
    layer once): the routing the plan is asked at, so only the per-expert and fixed counts are compared."""
    moe_layers = max(sum(type(layer.mlp).__name__ == "MoE" for layer in model.model.layers), 1)
    calls = {"prefill": moe_layers, "decode": moe_layers * max(decode_steps, 1)}
    return {stage: FixedRouting(n / calls[stage]) for stage, n in experts.items() if stage in calls}


@contextmanager
def expert_calls(model):
    """Counts, per stage, the routed experts' calls (each expert that got tokens runs once per MoE call)."""
    calls: Counter = Counter()
    where = {"stage": None}
    handles = []
    for layer in model.model.layers:
        for expert in getattr(layer.mlp, "experts", ()):
            handles.append(expert.register_forward_hook(lambda m, a, o: calls.update([where["stage"]])))
    stage_hook = model.model.layers[0].register_forward_pre_hook(
        lambda m, a: where.update(stage="decode" if a[0].shape[1] == 1 else "prefill"))
    try:
        yield calls
    finally:
        stage_hook.remove()
        for h in handles:
            h.remove()
