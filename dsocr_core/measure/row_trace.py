"""What really ran, row by row, against what the time model prices: the reference engine's kernels attributed to
the analytic rows whose modules launched them, beside the kernel plan and the predicted time of the same rows.

The time model (analytic/predict.py) prices each row from the engine's kernel plan (runtime/reference_plan.py);
runtime/op_count.py checks that plan's op counts against the model's dispatched ops. Neither says which kernels
take the device's time. This module runs the reference engine once (after an unprofiled warm-up of the same
workload) under torch.profiler with one `record_function` range per labelled module (op_count's module -> label
mapping: the row kinds and the blocks' `glue` labels; a forward pre-hook opens the range, the forward hook closes
it) and one per stage (the engine's timer stand-in opens them), then attributes:

  - on CUDA, every device kernel's time (memcpy and memset included) to the innermost row range around the CPU op
    that launched it (the profiler links kernels to their launching op by correlation id: FunctionEvent.kernels);
  - on the CPU, every aten op's self CPU time to the innermost row range around it; its "kernels" there are the
    top-level aten ops of the LAUNCH category (composites such as linear or a no-op `to` count as one), which is
    NOT the plan's launch count (op_count and its test check that one exactly): a rough guide only.

Per stage the result is each row label's time, kernel count and kernels by name, the time outside any row range
and the stage's own total (the stage ranges' subtrees, summed independently of the rows).

The plan side (`planned_rows`) gives, per stage and row kind, the predicted time split (roofline, kernel excess,
launch, host; Predictor.row times the row's module count) and the plan's kernels. `plan_vs_trace` joins both,
grouped as op_count.group_of groups them: a block's own code (residual adds, SAM's window partition, the expert
loop) runs outside the modules the rows name, and the plan files those ops under one of the block's rows, so only
a group's measured and planned numbers are like for like; its members are kept to show where the time goes.
"""
from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch

from ..analytic.kernels import Call
from ..registry import stage_rank
from ..runtime.op_count import (LAUNCH, category, expert_calls, group_of, observed_routing, planned_ops, row_labels,
                                workload_rows)

ROW_RANGE, STAGE_RANGE = "row::", "stage::"  # prefixes of the profiler ranges this module opens
OUTSIDE = "outside"  # label of a stage's work that no row range encloses
NO_STAGE = "none"  # stage of work outside every stage range


# ------------------------------------------------------------------------------------------ ranges
@contextmanager
def row_ranges(modules: dict[torch.nn.Module, str]):
    """A profiler range `row::<label>` around every labelled module's forward (innermost wins when attributing)."""
    open_ranges: list = []

    def enter(label: str) -> None:  # a pre-hook's return value would replace the module's inputs: return None
        rf = torch.profiler.record_function(ROW_RANGE + label)
        rf.__enter__()
        open_ranges.append(rf)

    def leave() -> None:  # a forward hook's return value would replace the output: return None
        open_ranges.pop().__exit__(None, None, None)

    handles = []
    for mod, label in modules.items():
        handles.append(mod.register_forward_pre_hook(lambda m, a, label=label: enter(label)))
        handles.append(mod.register_forward_hook(lambda m, a, o: leave()))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def stage_range(name: str):
    return torch.profiler.record_function(STAGE_RANGE + name)


class _RangeTimer:
    """The engine's timer stand-in: each stage the engine times becomes a profiler range (or nothing)."""

    def __init__(self, stage):
        self._stage = stage
        self.current = None

    @contextmanager
    def stage(self, name: str, track_memory: bool = False, count: int = 1):
        with self._stage(name):
            yield None


def no_range(name: str):
    return nullcontext()


def run_reference(engine, inputs, decode_steps: int, ngram: int = 20, stage=no_range) -> None:
    """One prefill (stages sam, clip, projector, prefill), the first token's choice (first_token) and
    `decode_steps` greedy steps (decode), as op_count.count_reference_run runs them; `stage(name)` wraps each."""
    b = inputs.input_ids.shape[0]
    with torch.no_grad():
        logits, cache = engine.prefill(inputs, logits="last", timer=_RangeTimer(stage), room=decode_steps + 1)
        with stage("first_token"):
            finished = torch.zeros(b, dtype=torch.bool, device=inputs.input_ids.device)
            token = logits[:, -1].argmax(-1)
        for _ in range(decode_steps):
            with stage("decode"):
                token = engine.greedy(cache, token, 1, ngram, finished)[:, 0]


# ------------------------------------------------------------------------------------------ measured side
@dataclass
class MeasuredRow:
    """One row label's work in one stage: time (ms), kernels launched and, per kernel (CPU: aten op) name,
    [ms, occurrences]."""

    ms: float = 0.0
    kernels: int = 0
    names: dict[str, list] = field(default_factory=lambda: defaultdict(lambda: [0.0, 0]))

    def add(self, name: str, ms: float, launches: int, occurrences: int = 1) -> None:
        self.ms += ms
        self.kernels += launches
        entry = self.names[name]
        entry[0] += ms
        entry[1] += occurrences

    def merge(self, other: "MeasuredRow") -> None:
        self.kernels += other.kernels
        for name, (ms, n) in other.names.items():
            self.add(name, ms, 0, n)

    def top(self, n: int | None = 3) -> list[dict]:
        ranked = sorted(self.names.items(), key=lambda kv: -kv[1][0])[:n]
        return [{"name": name, "ms": ms, "count": count} for name, (ms, count) in ranked]


@dataclass
class MeasuredStage:
    total_ms: float = 0.0  # the stage ranges' subtrees (independent of the row attribution)
    rows: dict[str, MeasuredRow] = field(default_factory=lambda: defaultdict(MeasuredRow))


def _range_of(event, prefix: str) -> str | None:
    """The innermost range with `prefix` enclosing `event` (itself included), without the prefix."""
    while event is not None:
        if event.name.startswith(prefix):
            return event.name[len(prefix):]
        event = event.cpu_parent
    return None


def _is_range(event) -> bool:
    return event.name.startswith((ROW_RANGE, STAGE_RANGE))


def _aten(event) -> str | None:
    return event.name[len("aten::"):] if event.name.startswith("aten::") else None


def _device_kernels(event) -> list:
    """The device work an op launched (a range's own device-side annotation excluded)."""
    return [k for k in event.kernels if not k.name.startswith((ROW_RANGE, STAGE_RANGE))]


def _top_level(event) -> bool:
    """No aten op encloses it: what the model's code called (a CPU kernel's own aten calls are below it)."""
    parent = event.cpu_parent
    while parent is not None and not _is_range(parent):
        if _aten(parent) is not None:
            return False
        parent = parent.cpu_parent
    return True


def _cpu_work(event) -> tuple[float, int]:
    """(self CPU ms, kernels) of one aten op: a "kernel" is a top-level aten op of op_count's LAUNCH category (not
    a view, an allocation or a host read); composites count once, so this is not the plan's launch count."""
    launches = int(category(_aten(event)) == LAUNCH and _top_level(event))
    return event.self_cpu_time_total / 1e3, launches


def attribute(events, cuda: bool) -> dict[str, MeasuredStage]:
    """Per stage, per row label: the measured work (see the module docstring)."""
    stages: dict[str, MeasuredStage] = defaultdict(MeasuredStage)
    for ev in events:
        if ev.device_type != torch.autograd.DeviceType.CPU or ev.is_async:
            continue
        work = ([(k.name, k.duration / 1e3, 1) for k in _device_kernels(ev)] if cuda
                else [(ev.name, *_cpu_work(ev))] if _aten(ev) is not None else [])
        if work:
            stage = _range_of(ev, STAGE_RANGE) or NO_STAGE
            row = stages[stage].rows[_range_of(ev, ROW_RANGE) or OUTSIDE]
            for name, ms, launches in work:
                row.add(name, ms, launches)
    for ev in events:  # stage totals from the stage ranges' subtrees: a check on the rows' attribution
        if ev.name.startswith(STAGE_RANGE) and ev.device_type == torch.autograd.DeviceType.CPU:
            stages[ev.name[len(STAGE_RANGE):]].total_ms += _subtree_ms(ev, cuda)
    if NO_STAGE in stages:
        stages[NO_STAGE].total_ms = sum(r.ms for r in stages[NO_STAGE].rows.values())
    return dict(stages)


def _subtree_ms(event, cuda: bool) -> float:
    own = (sum(k.duration for k in _device_kernels(event)) / 1e3 if cuda
           else (event.self_cpu_time_total / 1e3 if _aten(event) is not None else 0.0))
    return own + sum(_subtree_ms(c, cuda) for c in event.cpu_children)


def unattributed_device_ms(events) -> float:
    """Device kernel time no CPU op claims (kernels the profiler could not link): should be about zero."""
    device = sum(ev.time_range.elapsed_us() for ev in events
                 if ev.device_type == torch.autograd.DeviceType.CUDA and not _is_range(ev))
    linked = sum(k.duration for ev in events if ev.device_type == torch.autograd.DeviceType.CPU
                 for k in _device_kernels(ev))
    return (device - linked) / 1e3


def trace_reference_run(engine, inputs, row_paths: dict[str, tuple[str, ...]], decode_steps: int = 1,
                        ngram: int = 20, warmup: bool = True) -> tuple[dict[str, MeasuredStage], float]:
    """A warm-up run (unless the caller ran one), then one profiled run with row and stage ranges: (per stage
    measured rows, device ms the profiler left unlinked to any op; 0 on the CPU)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = engine.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if warmup:  # the allocator's pool, cuBLAS handles and kernel choices: first-run costs, not profiled
        run_reference(engine, inputs, decode_steps, ngram)
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with row_ranges(row_labels(engine.model, row_paths)), profile(activities=activities) as prof:
        run_reference(engine, inputs, decode_steps, ngram, stage=stage_range)
        sync()
    events = prof.events()
    return attribute(events, cuda), (unattributed_device_ms(events) if cuda else 0.0)


# ------------------------------------------------------------------------------------------ plan side
@dataclass
class PlannedRow:
    """One row kind of one stage, all its modules and calls (decode: all steps): the plan and the prediction."""

    launches: float = 0.0
    predicted: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # Predictor.row's columns
    kernels: list[dict] = field(default_factory=list)

    @property
    def device_ms(self) -> float:
        p = self.predicted
        return 1e3 * (p["predicted_roofline_s"] + p["predicted_kernel_s"] + p["predicted_launch_s"])

    @property
    def host_ms(self) -> float:
        return 1e3 * self.predicted["predicted_host_s"]


def _scalar(x) -> float:
    return float(np.asarray(x, dtype=float).reshape(-1)[0])


def _kernel_record(k, count: int) -> dict:
    return {"table": k.table, "coords": {a: _scalar(v) for a, v in k.coords.items()},
            "launches": count * _scalar(k.launches), "flops": count * _scalar(k.flops),
            "bytes": count * _scalar(k.nbytes)}


def planned_rows(predictors: dict, rows_by_stage: dict[str, list]) -> dict[str, dict[str, PlannedRow]]:
    """Per stage and row kind: launches (op_count.planned_ops), predicted time by component and the plan's
    kernels (per call part; the remainder the plan leaves to elementwise kernels as `rest`), each times the
    row's module count. `predictors[stage]` prices the stage (its routing is the run's)."""
    out: dict[str, dict[str, PlannedRow]] = {}
    for stage, rows in rows_by_stage.items():
        pred = predictors[stage]
        for row in rows:
            entry = out.setdefault(stage, {}).setdefault(row.kind, PlannedRow())
            entry.launches += planned_ops(pred.plan, row, pred.routing).launches
            for key, v in pred.row(row).items():
                entry.predicted[key] += row.count * _scalar(v)
            for part, ctx in zip(row.parts or (row.cost,), row.ctx):
                pl = pred.plan.plan(Call(row.kind, part, ctx, routing=pred.routing))
                entry.kernels += [_kernel_record(k, row.count) for k in pl.kernels]
                if _scalar(pl.rest_launches):
                    entry.kernels.append({"table": f"rest ({pl.rest_table})", "coords": {},
                                          "launches": row.count * _scalar(pl.rest_launches)})
    return out


# ------------------------------------------------------------------------------------------ both
def plan_vs_trace(model, profile, mode: str = "gundam", grid: tuple[int, int] = (1, 1), batch: int = 1,
                  text_tokens: int = 10, decode_steps: int = 1, ngram: int = 20) -> dict:
    """Run the reference engine over `model` on synthetic inputs of one workload (as op_count.compare_workload
    builds them, on the model's device) and join, per stage and group of rows, what ran with what the
    reference plan and `profile`'s time model say. JSON-ready."""
    from ..analytic.points import Points
    from ..analytic.predict import Prediction, Predictor
    from ..engines import as_engine
    from ..runtime.engine import ReferenceEngine
    from ..runtime.inputs import synthetic_inputs

    engine = ReferenceEngine(model)
    dtype = model.lm_head.weight.dtype
    pts = Points.build(mode=mode, crops=grid, text_tokens=text_tokens, batch=batch, decode_steps=decode_steps,
                       dtype=str(dtype).removeprefix("torch."), attn=model.attn_impl, logits="last")
    rows = workload_rows(model.spec, pts, decode_steps)
    paths = {row.kind: tuple(row.paths) for stage_rows in rows.values() for row in stage_rows}
    inputs = synthetic_inputs(mode, grid, text_tokens, batch, dtype=dtype, device=engine.device)
    with expert_calls(model) as experts:  # the warm-up's routing is the profiled run's (the same inputs)
        run_reference(engine, inputs, decode_steps, ngram)
    measured, unlinked = trace_reference_run(engine, inputs, paths, decode_steps, ngram, warmup=False)
    routing = observed_routing(model, experts, decode_steps)
    predictors = {stage: Predictor(Prediction(profile, as_engine("reference"), routing=routing.get(stage)))
                  for stage in rows}
    planned = planned_rows(predictors, rows)
    return {"workload": {"mode": mode, "grid": list(grid), "batch": batch, "text_tokens": text_tokens,
                         "decode_steps": decode_steps, "sequence": int(_scalar(pts.sequence))},
            "device": engine.device.type, "measured_as": "device kernel time" if engine.device.type == "cuda"
            else "aten ops' self CPU time", "unattributed_device_ms": unlinked,
            "routing": {s: r.experts for s, r in routing.items()},
            "stages": [_stage_record(stage, measured.get(stage), planned.get(stage, {}))
                       for stage in _stage_order(measured, planned)]}


def _stage_order(measured: dict, planned: dict) -> list[str]:
    """Running order (the registry's), the timer's first_token right after the prefill, work outside every stage
    last."""
    def rank(stage: str) -> tuple:
        if stage == NO_STAGE:
            return (2, 0, stage)
        base = stage_rank("prefill") if stage == "first_token" else stage_rank(stage)
        return (0 if base < 1 << 10 else 1, base + (0.5 if stage == "first_token" else 0), stage)

    return sorted(set(measured) | set(planned), key=rank)


def _stage_record(stage: str, measured: MeasuredStage | None, planned: dict[str, PlannedRow]) -> dict:
    measured = measured or MeasuredStage()
    groups: dict[str, dict] = {}
    for kind, p in planned.items():  # the plan's order (the model's), then labels only the run has
        g = groups.setdefault(group_of(stage, kind), {"members": {}})
        g["members"].setdefault(kind, {})["planned"] = p
    for label, m in measured.rows.items():
        g = groups.setdefault(group_of(stage, label), {"members": {}})
        g["members"].setdefault(label, {})["measured"] = m
    return {"stage": stage, "total_ms": measured.total_ms,
            "rows_ms": sum(m.ms for label, m in measured.rows.items() if label != OUTSIDE),
            "outside_ms": measured.rows[OUTSIDE].ms if OUTSIDE in measured.rows else 0.0,
            "groups": [_group_record(name, g["members"]) for name, g in groups.items()]}


def _group_record(name: str, members: dict[str, dict]) -> dict:
    total_m, total_p = MeasuredRow(), PlannedRow()
    records = []
    for label, both in members.items():
        m, p = both.get("measured"), both.get("planned")
        if m is not None:
            total_m.merge(m)
        if p is not None:
            total_p.launches += p.launches
            for key, v in p.predicted.items():
                total_p.predicted[key] += v
        records.append({"row": label, **_side_record(m, p), "planned_kernels": p.kernels if p else []})
    return {"group": name, **_side_record(total_m, total_p), "members": records}


def _side_record(m: MeasuredRow | None, p: PlannedRow | None) -> dict:
    out = {"measured_ms": m.ms if m else 0.0, "kernels": m.kernels if m else 0, "top_kernels": m.top() if m else [],
           "all_kernels": m.top(None) if m else [], "planned_launches": p.launches if p else 0.0}
    if p is not None and p.predicted:
        out.update(predicted_device_ms=p.device_ms, predicted_host_ms=p.host_ms,
                   predicted={k: 1e3 * v for k, v in p.predicted.items()})
        out["ratio"] = out["measured_ms"] / p.device_ms if p.device_ms > 0 else None
    return out


# ------------------------------------------------------------------------------------------ table
def format_table(result: dict, top: int = 3) -> str:
    """One table per stage: row | measured ms | kernels | planned launches | predicted device ms | predicted
    host excess ms (the host's time beyond the device's, max(H - D, 0)) | ratio (measured / predicted device),
    members indented under their group, each member's top `top` measured kernels under it."""
    cpu = result["device"] != "cuda"
    head = f"{'row':<44}{'measured ms':>12}{'ops' if cpu else 'kernels':>9}{'plan launches':>14}" \
           f"{'pred dev ms':>12}{'host excess':>13}{'ratio':>10}"
    lines = [f"measured: {result['measured_as']}; predicted device = roofline + kernel excess + launch; host "
             "excess = predicted host time beyond the device's; ratio = measured / predicted device"
             + ("; on a CPU 'ops' are top-level aten ops, not comparable with the plan's launches" if cpu else "")]
    for st in result["stages"]:
        lines += ["", f"== {st['stage']}: {st['total_ms']:.3f} ms in the stage, {st['rows_ms']:.3f} in rows, "
                      f"{st['outside_ms']:.3f} outside any row", head]
        for g in st["groups"]:
            lines.append(_line(g["group"], g))
            single = len(g["members"]) == 1 and g["members"][0]["row"] == g["group"]
            for mem in g["members"]:
                if not single:
                    lines.append(_line("  " + mem["row"], mem))
                lines += [f"{'':<6}{k['ms']:9.3f} ms x{k['count']:<5d} {k['name'][:100]}"
                          for k in mem["top_kernels"][:top]]
    return "\n".join(lines)


def _line(name: str, rec: dict) -> str:
    dev = rec.get("predicted_device_ms")
    host = rec.get("predicted_host_ms")
    ratio = rec.get("ratio")
    fmt = lambda v, w, f: f"{'-':>{w}}" if v is None else f"{v:>{w}{f}}"  # noqa: E731
    return (f"{name[:43]:<44}{rec['measured_ms']:>12.3f}{rec['kernels']:>9d}{rec['planned_launches']:>14.0f}"
            f"{fmt(dev, 12, '.3f')}{fmt(host, 13, '.3f')}{fmt(ratio, 10, '.2f')}")
