"""Operator breakdown per stage: a torch.profiler pass over a few pages, operator (and, on CUDA, kernel) time
grouped by the stage the work ran in.

Stage ranges: `ProfiledStageTimer` is the session's StageTimer with a `torch.profiler.record_function` range
named `dsocr::<stage>` opened inside every timed stage (sam, clip, projector, prefill, each decode step), so the
profiler sees exactly the spans the timer times (the NVTX ranges of the StageTimer serve nsys; torch.profiler
does not read NVTX). The pass adds `dsocr::preprocess` around loading and preprocessing each page, and a
`dsocr.page::<page>` range around each page, which shows in the Chrome trace.

Grouping (`group_events`): every CPU event is given the stage of its nearest enclosing stage range (walking the
profiler's CPU parent links); events outside all stage ranges (token choice, n-gram ban, bookkeeping between
steps) get the stage `outside`. Per stage, CPU rows are the operators' SELF times; the stage ranges' own self
time (Python and anything the profiler does not trace) is one row, `(untraced: Python and non-torch work)`.
Self times telescope, so a stage's rows sum to the summed duration of its ranges (`range_us`) and its shares to
1. On CUDA, each kernel (and memcpy/memset) is attributed through the CPU operator that launched it; its stage's
CUDA total is the kernels' summed device time (GPU busy time, not the wall span), and shares are of that.

Results: a DataFrame of operators (stage, device, operator, calls, self_us, share, stage_total_us, rank), one of
stage totals, a CSV of each and a Chrome trace (open in https://ui.perfetto.dev). `OperatorProfile.to_meta()`
keeps the top operators per stage in the run's meta, where `stats.operator_table` reads them back.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import pandas as pd
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, record_function

from ..registry import LM_STAGES, vision_stage_names
from ..runtime.timing import StageTimer

RANGE_PREFIX = "dsocr::"
PAGE_PREFIX = "dsocr.page::"
STAGES = ("preprocess", *vision_stage_names(), *LM_STAGES)  # every family's stages (registry)
OUTSIDE = "outside"
STAGE_ORDER = (*STAGES, OUTSIDE)
UNTRACED = "(untraced: Python and non-torch work)"
OTHERS = "(other operators)"
OPERATOR_COLUMNS = ("stage", "device", "operator", "calls", "self_us", "share", "stage_total_us", "rank")
STAGE_COLUMNS = ("stage", "device", "ranges", "range_us", "total_us", "share_of_total")
DEFAULT_TRACE_TOKENS = 32  # decode steps per traced page: a full 512-token trace is hundreds of MB


class ProfiledStageTimer(StageTimer):
    """StageTimer whose stages are also torch.profiler ranges (`dsocr::<stage>`), opened inside the timed span."""

    @contextmanager
    def stage(self, name: str, track_memory: bool = False, count: int = 1):
        with super().stage(name, track_memory, count) as mark:
            with record_function(RANGE_PREFIX + name):
                yield mark


def _own(name: str) -> bool:
    return name.startswith(RANGE_PREFIX) or name.startswith(PAGE_PREFIX)


def _stage_order(stage: str) -> int:
    return STAGE_ORDER.index(stage) if stage in STAGE_ORDER else len(STAGE_ORDER)


def group_events(events: Iterable) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(operators, stages) from a profiler's events (`prof.events()`, a FunctionEvent list with its CPU tree
    built). See the module docstring for the rules."""
    memo: dict[int, str] = {}

    def stage_of(evt) -> str:
        chain, e, stage = [], evt, OUTSIDE
        while e is not None:
            if id(e) in memo:
                stage = memo[id(e)]
                break
            if e.name.startswith(RANGE_PREFIX):
                stage = e.name[len(RANGE_PREFIX):]
                break
            chain.append(e)
            e = e.cpu_parent
        for c in chain:
            memo[id(c)] = stage
        return stage

    acc: dict[tuple[str, str, str], list[float]] = {}
    ranges: dict[str, list[float]] = {}

    def add(key: tuple[str, str, str], us: float) -> None:
        slot = acc.setdefault(key, [0, 0.0])
        slot[0] += 1
        slot[1] += us

    for evt in events:
        if evt.device_type != DeviceType.CPU or evt.is_async:
            continue  # kernels are read through their launching CPU op; async events have no self time
        stage = stage_of(evt)
        if evt.name.startswith(RANGE_PREFIX):
            slot = ranges.setdefault(stage, [0, 0.0])
            slot[0] += 1
            slot[1] += evt.cpu_time_total
        name = UNTRACED if _own(evt.name) else evt.name
        add((stage, "cpu", name), evt.self_cpu_time_total)
        for k in getattr(evt, "kernels", ()):
            if not _own(k.name):  # the GPU side of our own ranges is not a kernel
                add((stage, "cuda", k.name), k.duration)

    rows = [{"stage": s, "device": d, "operator": o, "calls": int(c), "self_us": float(us)}
            for (s, d, o), (c, us) in acc.items()]
    ops = pd.DataFrame(rows, columns=["stage", "device", "operator", "calls", "self_us"])
    return _finish_operators(ops), _stage_table(ops, ranges)


def _finish_operators(ops: pd.DataFrame) -> pd.DataFrame:
    if ops.empty:
        return pd.DataFrame(columns=list(OPERATOR_COLUMNS))
    ops = ops.copy()
    ops["stage_total_us"] = ops.groupby(["stage", "device"])["self_us"].transform("sum")
    ops["share"] = (ops["self_us"] / ops["stage_total_us"]).where(ops["stage_total_us"] > 0, 0.0)
    ops["_order"] = ops["stage"].map(_stage_order)
    ops = ops.sort_values(["_order", "device", "self_us", "operator"], ascending=[True, True, False, True])
    ops["rank"] = ops.groupby(["stage", "device"]).cumcount() + 1
    return ops.drop(columns="_order")[list(OPERATOR_COLUMNS)].reset_index(drop=True)


def _stage_table(ops: pd.DataFrame, ranges: dict[str, list[float]]) -> pd.DataFrame:
    if ops.empty:
        return pd.DataFrame(columns=list(STAGE_COLUMNS))
    tot = ops.groupby(["stage", "device"], as_index=False).agg(total_us=("self_us", "sum"))
    tot["ranges"] = [int(ranges.get(s, (0, 0))[0]) if d == "cpu" else None for s, d in zip(tot["stage"], tot["device"])]
    tot["range_us"] = [float(ranges[s][1]) if d == "cpu" and s in ranges else None
                       for s, d in zip(tot["stage"], tot["device"])]
    tot["share_of_total"] = tot["total_us"] / tot.groupby("device")["total_us"].transform("sum")
    tot["_order"] = tot["stage"].map(_stage_order)
    tot = tot.sort_values(["device", "_order"]).drop(columns="_order")
    tot["ranges"] = tot["ranges"].astype("Int64")
    return tot[list(STAGE_COLUMNS)].reset_index(drop=True)


def top_operators(ops: pd.DataFrame, n: int = 10) -> pd.DataFrame:
    """The `n` largest operators of each (stage, device) by self time, the rest folded into one
    `(other operators)` row, so each group still sums to its stage total."""
    if ops.empty:
        return ops.copy()
    parts = []
    for _, group in ops.groupby(["stage", "device"], sort=False):
        group = group.sort_values("rank")
        head, rest = group.head(n), group.iloc[n:]
        parts.append(head)
        if len(rest):
            first = rest.iloc[0]
            parts.append(pd.DataFrame([{
                "stage": first["stage"], "device": first["device"], "operator": OTHERS,
                "calls": int(rest["calls"].sum()), "self_us": float(rest["self_us"].sum()),
                "share": float(rest["share"].sum()), "stage_total_us": float(first["stage_total_us"]),
                "rank": n + 1}]))
    out = pd.concat(parts, ignore_index=True)
    out["calls"] = out["calls"].astype(int)
    out["rank"] = out["rank"].astype(int)
    return out[list(OPERATOR_COLUMNS)]


# ---------------------------------------------------------------------------------------------- the pass
@dataclass
class OperatorProfile:
    operators: pd.DataFrame  # OPERATOR_COLUMNS, every operator
    stages: pd.DataFrame  # STAGE_COLUMNS
    pages: list[str] = field(default_factory=list)  # sample labels that were profiled
    device: str = "cpu"
    max_new_tokens: int = DEFAULT_TRACE_TOKENS
    files: dict[str, str] = field(default_factory=dict)  # operators_csv, stages_csv, trace

    def to_meta(self, top: int = 25) -> dict:
        """JSON-friendly summary for the run's meta: the top operators per stage and the stage totals."""
        return {"pages": list(self.pages), "device": self.device, "max_new_tokens": self.max_new_tokens,
                "files": dict(self.files), "top": top,
                "operators": top_operators(self.operators, top).to_dict(orient="records"),
                "stages": self.stages.astype(object).where(self.stages.notna(), None).to_dict(orient="records")}

    @classmethod
    def from_meta(cls, meta: dict) -> "OperatorProfile":
        ops = pd.DataFrame(meta.get("operators") or [], columns=list(OPERATOR_COLUMNS))
        stages = pd.DataFrame(meta.get("stages") or [], columns=list(STAGE_COLUMNS))
        if not stages.empty:
            stages["ranges"] = stages["ranges"].astype("Int64")
            for c in ("range_us", "total_us", "share_of_total"):
                stages[c] = stages[c].astype("float64")
        return cls(ops, stages, list(meta.get("pages") or []), meta.get("device", "cpu"),
                   int(meta.get("max_new_tokens") or 0), dict(meta.get("files") or {}))


def store_operator_profile(store, run_id: str, profile: OperatorProfile, top: int = 25) -> None:
    """Keep `profile` (its top operators per stage and its stage totals) in the run's meta, where
    stats.operator_table and stats.operator_stages read it. A later profile replaces an earlier one."""
    store.update_run(run_id, meta={"operators": profile.to_meta(top)})


def profile_operators(session, samples: Sequence, settings, n_pages: int = 2,
                      max_new_tokens: int = DEFAULT_TRACE_TOKENS, out_dir: str | Path | None = None,
                      record_shapes: bool = False) -> OperatorProfile:
    """torch.profiler over the first `n_pages` readable samples (each warmed up first, outside the profiler),
    generating `max_new_tokens` tokens per page with the run's settings (dataset_run.ProfileSettings).
    With `out_dir`, writes operators.csv, operator_stages.csv and trace.json (Chrome trace) there.
    Raises ValueError when no sample is readable."""
    from .datasets import load_page
    from ..runtime.inputs import ImageError
    from .stage_stats import timed_generation

    if n_pages < 1 or max_new_tokens < 1:
        raise ValueError("n_pages and max_new_tokens must be at least 1")
    gen = dict(no_repeat_ngram_size=settings.no_repeat_ngram_size, logits=settings.logits, memory="loop")
    chosen = []
    seen = set()
    for s in samples:
        if len(chosen) == n_pages:
            break
        if (s.page.name, s.page.pdf_page) in seen:
            continue  # the same page again in a later epoch adds nothing
        try:
            image = load_page(s.page, settings.dpi)
        except ImageError:
            continue
        seen.add((s.page.name, s.page.pdf_page))
        chosen.append(s)
        with session.lock:  # warm-up for this page's shapes, not profiled
            inputs = session.prepare(image, settings.prompt, mode=settings.mode, min_crops=settings.min_crops,
                                     max_crops=settings.max_crops)
            timed_generation(session, inputs, min(2, max_new_tokens), **gen)
    if not chosen:
        raise ValueError("no readable page to profile")
    activities = [ProfilerActivity.CPU]
    if session.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with session.lock, torch.profiler.profile(activities=activities, record_shapes=record_shapes) as prof:
        for s in chosen:
            with record_function(PAGE_PREFIX + s.page.label):
                with record_function(RANGE_PREFIX + "preprocess"):
                    image = load_page(s.page, settings.dpi)
                    inputs = session.prepare(image, settings.prompt, mode=settings.mode,
                                             min_crops=settings.min_crops, max_crops=settings.max_crops)
                timed_generation(session, inputs, max_new_tokens, timer=ProfiledStageTimer(session.device), **gen)
    ops, stages = group_events(prof.events())
    result = OperatorProfile(ops, stages, [s.page.label for s in chosen], str(session.device), max_new_tokens)
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        files = {"operators_csv": out / "operators.csv", "stages_csv": out / "operator_stages.csv",
                 "trace": out / "trace.json"}
        ops.to_csv(files["operators_csv"], index=False)
        stages.to_csv(files["stages_csv"], index=False)
        prof.export_chrome_trace(str(files["trace"]))
        result.files = {k: str(v) for k, v in files.items()}
    return result
