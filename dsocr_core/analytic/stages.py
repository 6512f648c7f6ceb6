"""Rows for every stage of a sweep, and stage totals (the numbers the CLI JSON and the sweep export carry).

Stages (dsocr_core/registry.py): the family's vision stages (DeepSeek-OCR: sam, clip, projector; DeepSeek-OCR 2:
sam, encoder, projector; once per image: a global view, plus n tiles in crop modes),
prefill (the LM over the whole prompt), decode (summed over the workload's decode steps; step i attends to
prompt + i cached tokens). Derived: vision = the sum of the vision stages; total = vision + prefill + decode.

Calls: all global views of a batch go through SAM/CLIP/projector as one call, all tiles as another (weights read
once per call). Stage time = sum over its modules and calls of max(compute, memory) (each kernel bound on its own);
a stage's `bound` says whether its aggregate FLOP time or byte time is larger.
Footprints: weight_memory = parameter bytes of the stage's modules (prefill and decode both own the LM weights;
total counts them once); kv_cache_memory = cache size at the end of the stage; peak_activation_memory = the
largest live set of any one module (modules run one at a time; weights and KV cache not included).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..registry import ModelFamily, family_of, get_family
from ..spec import DecoderSpec as ModelSpec
from ..tiling import features_per_side, mode_info
from .cost import ADDITIVE, Cost, Row, affine_sum
from .lm import lm_rows
from .params import param_counts
from .points import Points, distinct_tuples
from .predict import PREDICTED, predictor_for
from .roofline import bound_of
from .vision import clip_tokens

STAGES = get_family().all_stages  # the default model's; a model's own: registry.get_family(name).all_stages
METRICS = ("flops", "tensor_flops", "tensor_flops_causal", "other_flops", "bytes", "weight_bytes",
           "activation_bytes", "activation_read_bytes", "activation_write_bytes", "kv_bytes", "kv_read_bytes",
           "kv_write_bytes", "weight_memory", "peak_activation_memory", "kv_cache_memory", "intensity")
TIME_METRICS = ("compute_s", "memory_s", "time_s", "bound")


@lru_cache(maxsize=256)
def _view_rows(spec: ModelSpec, side: int, dt: int):
    return family_of(spec).load("analytic").view_rows(spec, side, dt, param_counts(spec))


def _check_mode(spec: ModelSpec, mode: str) -> None:
    fam = family_of(spec)
    if mode not in fam.modes:
        from ..spec import SpecError

        raise SpecError(f"mode {mode!r} is not a {fam.label} mode; choose one of {', '.join(fam.modes)}")


def vision_rows(spec: ModelSpec, pts: Points) -> list[Row]:
    """The vision stages' rows (SAM, then CLIP or the encoder, then the projector): the global view of every image,
    then all tiles, as two calls. A row that only one view size has (DeepSeek-OCR 2's query table of that size)
    gets a zero cost for the other call."""
    _check_mode(spec, pts.mode)
    info, dt = mode_info(pts.mode), pts.dtype_bytes
    b = pts.batch.astype(float)
    tiles = b * pts.n_tiles  # tile views in the batch
    glob = _view_rows(spec, info.base_size, dt)
    tile = _view_rows(spec, info.tile_size, dt) if info.crop_mode else [(s, k, p, Cost()) for s, k, p, _ in glob]
    rows = []
    calls_t = (tiles > 0).astype(float)
    tile_side = info.tile_size if info.crop_mode else info.base_size
    # all views' CLIP rows: the fast engine packs them through each CLIP layer together (analytic/kernels.py)
    packed = b * clip_tokens(spec, info.base_size) + (tiles * clip_tokens(spec, tile_side) if info.crop_mode else 0.0)
    base = dict(spec=spec, phase="vision", dt=dt, dtype=pts.dtype, batch=b, packed_rows=packed)
    ctx = (dict(base, side=info.base_size, views=b, calls=1.0),
           dict(base, side=tile_side, views=tiles, calls=calls_t))
    merged: dict[str, list] = {}  # kind -> [stage, paths, global-view cost, tile-view cost]
    for which, view in ((2, glob), (3, tile)):
        for stage, kind, paths, cost in view:
            merged.setdefault(kind, [stage, paths, None, None])[which] = cost
    stage_pos = family_of(spec).stage_names.index
    for kind in sorted(merged, key=lambda k: stage_pos(merged[k][0])):  # stable: view order within a stage
        stage, paths, g, t = merged[kind]
        held = (g or t).weight_memory  # the module exists whichever view runs it
        g, t = g or Cost(weight_memory=held), t or Cost(weight_memory=held)
        part_g = g.scaled(b, 1.0)  # one call over the batch's global views
        part_t = t.scaled(tiles, calls_t)  # one call over all tiles, if any
        rows.append(Row(stage, kind, paths, part_g.then(part_t), parts=(part_g, part_t), ctx=ctx))
    rows.append(layout_row(spec, pts))
    return rows


def layout_row(spec: ModelSpec, pts: Points) -> Row:
    """Per image, the projected features are laid out (DeepSeek-OCR: `image_newline` after every row) with
    `view_seperator` at the end. No FLOPs; the row carries the layout vectors (keyed by model.image_newline, or by
    model.view_seperator where there is no newline)."""
    info, dt, h = mode_info(pts.mode), pts.dtype_bytes, spec.hidden_size
    b = pts.batch.astype(float)
    feats = features_per_side(info.base_size) ** 2 + pts.n_tiles * features_per_side(info.tile_size) ** 2
    vectors = 2 if info.newlines else 1  # newline and separator, or the separator alone
    cost = Cost(weight_bytes=vectors * h * dt,
                act_read=b * feats * h * dt,  # projected features
                act_write=b * pts.image_slots * h * dt,  # laid-out slots
                peak_activation=b * (feats + pts.image_slots) * h * dt,
                weight_memory=vectors * h * dt)
    key = "model.image_newline" if info.newlines else "model.view_seperator"
    tiled = b * (pts.n_tiles > 0)  # images laid out with their tiles (the engines' plans count ops per part)
    return Row("projector", "projector.layout", (key,), cost,
               ctx=(dict(spec=spec, phase="layout", images=b, tiled=tiled, newlines=info.newlines, dt=dt,
                         dtype=pts.dtype),))


def prefill_rows(spec: ModelSpec, pts: Points) -> list[Row]:
    b = pts.batch.astype(float)
    seq = pts.sequence.astype(float)
    logit_rows = b * seq if pts.logits == "all" else b  # fp32 logits for every position, or the last one only
    img = pts.image_slots.astype(float)
    ctx = (dict(spec=spec, phase="prefill", b=b, sq=seq, n=0.0, img=img, logit_rows=logit_rows, attn=pts.attn,
                dt=pts.dtype_bytes, dtype=pts.dtype),)
    return [Row(stage, kind, paths, cost, ctx=ctx)
            for stage, kind, paths, cost in lm_rows(spec, b, seq, 0.0, img, logit_rows,
                                                     pts.attn, pts.dtype_bytes, param_counts(spec), "prefill")]


def decode_step_rows(spec: ModelSpec, pts: Points, context, stage: str = "decode") -> list[Row]:
    """One decode step (one new token per row) with `context` tokens already cached per row."""
    b = pts.batch.astype(float)
    n = np.broadcast_to(np.asarray(context, dtype=float), b.shape)
    ctx = (dict(spec=spec, phase="decode", b=b, sq=1.0, n=n, img=0.0, logit_rows=b, attn=pts.attn,
                dt=pts.dtype_bytes, dtype=pts.dtype),)
    return [Row(st, kind, paths, cost, ctx=ctx)
            for st, kind, paths, cost in lm_rows(spec, b, 1.0, n, 0.0, b, pts.attn, pts.dtype_bytes,
                                                  param_counts(spec), stage)]


def decode_rows(spec: ModelSpec, pts: Points) -> list[Row]:
    """Decode summed over the steps: contexts prompt .. prompt + steps - 1. Every count is affine in the context,
    so the sum is steps * (first + last) / 2 (closed form); footprints are those of the last step."""
    seq = pts.sequence.astype(float)
    steps = pts.decode_steps.astype(float)
    first = decode_step_rows(spec, pts, seq)
    last = decode_step_rows(spec, pts, seq + np.maximum(steps - 1, 0))
    rows = []
    live = steps > 0
    for f, l in zip(first, last):
        c = Cost(**{k: affine_sum(getattr(f.cost, k), getattr(l.cost, k), steps) for k in ADDITIVE})
        c.peak_activation = np.where(live, l.cost.peak_activation, 0.0)  # largest at the longest context
        c.kv_memory = np.where(live, l.cost.kv_memory, 0.0)  # cache after the last step
        c.weight_memory = l.cost.weight_memory
        rows.append(Row("decode", f.kind, f.paths, c, steps=(f.cost, l.cost, steps), ctx=(f.ctx[0], l.ctx[0])))
    return rows


def all_rows(spec: ModelSpec, pts: Points) -> list[Row]:
    return vision_rows(spec, pts) + prefill_rows(spec, pts) + decode_rows(spec, pts)


def _finish(acc: dict, hw) -> dict:
    """Derived metrics of one stage from its raw sums."""
    out = {
        "tensor_flops": acc["tensor_flops"], "tensor_flops_causal": acc["tensor_flops_causal"],
        "other_flops": acc["other_flops"],
        "flops": acc["tensor_flops"] + acc["other_flops"],  # all arithmetic; tensor_flops is torch's count
        "weight_bytes": acc["weight_bytes"],
        "activation_read_bytes": acc["act_read"], "activation_write_bytes": acc["act_write"],
        "activation_bytes": acc["act_read"] + acc["act_write"],
        "kv_read_bytes": acc["kv_read"], "kv_write_bytes": acc["kv_write"],
        "kv_bytes": acc["kv_read"] + acc["kv_write"],
        "weight_memory": acc["weight_memory"], "peak_activation_memory": acc["peak_activation"],
        "kv_cache_memory": acc["kv_memory"],
    }
    out["bytes"] = out["weight_bytes"] + out["activation_bytes"] + out["kv_bytes"]
    out["intensity"] = out["flops"] / np.maximum(out["bytes"], 1.0)  # FLOPs per byte (0 when nothing moves)
    if hw is not None:
        out["compute_s"], out["memory_s"], out["time_s"] = acc["compute_s"], acc["memory_s"], acc["time_s"]
        out["bound"] = bound_of(out["compute_s"], out["memory_s"], out["time_s"])
    for k in PREDICTED:
        if k in acc:
            out[k] = acc[k]
    return out


_SUMS = ADDITIVE + ("weight_memory", "kv_memory", "compute_s", "memory_s", "time_s")


def _accumulate(rows: list[Row], stages: tuple[str, ...], shape: tuple, hw=None) -> dict[str, dict]:
    """Raw per-stage sums of rows: counts add (x module count), peaks take the max, KV caches of layers add."""
    pred = predictor_for(hw)  # the time model, when the hardware carries a calibration profile
    keys = _SUMS + ("peak_activation",) + (PREDICTED if pred is not None else ())
    acc = {s: {k: np.zeros(shape) for k in keys} for s in stages}
    for row in rows:
        a, c, n = acc[row.stage], row.cost, row.count
        for k in ADDITIVE + ("weight_memory", "kv_memory"):
            a[k] = a[k] + n * getattr(c, k)  # every module of the row costs the same
        a["peak_activation"] = np.maximum(a["peak_activation"], c.peak_activation)  # modules run one at a time
        if hw is not None:
            cs, ms, ts = row.times(hw.peak_flops, hw.bandwidth)
            a["compute_s"], a["memory_s"], a["time_s"] = (a["compute_s"] + n * cs, a["memory_s"] + n * ms,
                                                          a["time_s"] + n * ts)
        if pred is not None:
            for k, v in pred.row(row, (hw.peak_flops, hw.bandwidth, ts)).items():
                a[k] = a[k] + n * v
    return acc


def _complete(acc: dict, hw, fam: ModelFamily) -> dict[str, dict[str, np.ndarray]]:
    acc["vision"] = _combine([acc[s] for s in fam.vision_stages], shared_weights=False)
    acc["total"] = _combine([acc["vision"], acc["prefill"], acc["decode"]], shared_weights=True)
    return {s: _finish(acc[s], hw) for s in fam.all_stages}


def rows_family(rows: list[Row]) -> ModelFamily:
    """The family of the spec the rows were computed for (every row's kernel context names it)."""
    for row in rows:
        for ctx in row.ctx:
            if "spec" in ctx:
                return family_of(ctx["spec"])
    return get_family()


def aggregate(rows: list[Row], shape: tuple, hw=None) -> dict[str, dict[str, np.ndarray]]:
    """Stage totals ({stage: {metric: array}}) of any list of rows over points of `shape`, in the stages of the
    rows' model family."""
    fam = rows_family(rows)
    return _complete(_accumulate(rows, fam.stage_names, shape, hw), hw, fam)


def _combine(parts: list[dict], shared_weights: bool) -> dict:
    """Stages run one after another: counts and times add, peaks and the final cache take the max. With
    shared_weights the last part (decode) reuses the LM weights of the one before (prefill)."""
    out = {k: sum(p[k] for p in parts) for k in parts[0] if k not in ("peak_activation", "kv_memory")}
    if shared_weights:
        out["weight_memory"] = sum(p["weight_memory"] for p in parts[:-1])
    out["peak_activation"] = np.maximum.reduce([p["peak_activation"] for p in parts])
    out["kv_memory"] = np.maximum.reduce([p["kv_memory"] for p in parts])
    return out


def evaluate(spec: ModelSpec, pts: Points, hardware=None) -> dict[str, dict[str, np.ndarray]]:
    """Stage totals for every point: {stage: {metric: array over points}}. With a Hardware, also compute_s,
    memory_s, time_s and bound. Vision depends only on (batch, crop grid) and prefill only on (batch, prompt),
    so each is evaluated once per distinct input and spread back (same formulas, fewer array elements)."""
    shape = (pts.size,)
    fam = family_of(spec)
    acc = {}
    first, inv = distinct_tuples([pts.batch, pts.crops_w, pts.crops_h])
    sub = _accumulate(vision_rows(spec, pts.take(first)), fam.vision_stages, first.shape, hardware)
    acc |= {s: {k: v[inv] for k, v in d.items()} for s, d in sub.items()}
    first, inv = distinct_tuples([pts.batch, pts.text_tokens, pts.crops_w, pts.crops_h])
    sub = _accumulate(prefill_rows(spec, pts.take(first)), ("prefill",), first.shape, hardware)
    acc |= {s: {k: v[inv] for k, v in d.items()} for s, d in sub.items()}
    acc |= _accumulate(decode_rows(spec, pts), ("decode",), shape, hardware)
    return _complete(acc, hardware, fam)


def flat(stages: dict[str, dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """{"prefill.flops": array, ...}: one column per stage metric."""
    return {f"{s}.{m}": v for s, d in stages.items() for m, v in d.items()}
