"""Dataset runs: every sampled page through the session, timed stage by stage, stored point by point.

Per page: load (PDF pages rendered at the data set's dpi), preprocess with the run's mode and crop range, then a
timed greedy generation through the session's engine (reference or fast): the one generator
(`generate.Greedy`), the prefill's sam, clip, projector and prefill stages timed by the StageTimer and every
engine call of the decode loop a `decode` entry, with the same token choice as every other path
(`generate.next_tokens`, n-gram ban included). No one-shot reference run is made: that is the parity work's
business, and it would double the cost of every page.

What is not timed: loading and preprocessing are timed apart (`preprocess_s`); an untimed warm-up generation
(2 tokens) runs before the first page of every new input shape (mode, tile grid, prompt length) when
`warmup="shape"` (the default), and again whenever the engine has dropped what it prepared for that shape since
(its `state_epoch` moved: a longer prompt grew the cache, so graphs are captured anew), so each timed page sees
warmed-up kernels and captured graphs, as a serving process would, whatever pages came before it;
FLOPs are counted in a separate FlopCounterMode pass after timing.

FLOPs (`flops="shape"`, the default): the counting pass (vision, prefill and two decode steps) runs once per
distinct input shape (mode, grid, prompt length, logits mode) and is reused for every later page of that shape;
vision and prefill FLOPs depend on nothing else, and K decode steps follow exactly from the two counted ones
(runtime/flops.decode_flops_total).
`flops="page"` counts every page (slower, same numbers); `flops="none"` skips counting.

Store layout (a run of kind `dataset`): one point per sample, key {"page", "pdf_page", "epoch"} (see
dataset.Sample.key), status done | oom | error. `resolved` holds mode, grid, image size, image slots, prompt
length (`sequence`), text tokens, batch 1 and decode_steps (decode steps actually run = generated tokens - 1,
the first token coming from the prefill). Stages: sam, clip, projector, vision, prefill, decode (the page's
summed decode time) and decode_step (statistics over the page's steps, FLOPs of the mean step); each with its
FLOPs and, on CUDA, peak
memory. `extra`: text, detections summary, decode_steps_s (every step), generated_tokens, eos, ttft_s,
tpot_s (median step, as Session), preprocess_s, generation_s, wall_s (preprocess + generation), flops_source
(counted | same shape | not counted | failed: <why>; a failed FLOP pass keeps the page's timings), engine_state
(how the page was run: the engine's point_state).
A resumed run skips points already done or oom; error points are tried again.

The order check (`order_check=True`, the default): after the last page the run's first page is measured again
and compared with its first measurement (measure/order_check.py); the result is in meta["order_check"].
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from statistics import median
from typing import Callable, Literal, Sequence

from ..results.store import RunStore, point_key
from ..runtime import gpu_state
from ..runtime.gpu_clocks import StageClocks
from ..runtime.host_speed import probe_host_op_s, probe_median
from ..runtime.tokens import trim_at_eos
from ..runtime.inputs import DEFAULT_PROMPT, ImageError
from ..results.runs import run_model
from ..runtime.session import Session
from ..runtime.timing import synchronize
from .datasets import Dataset, Sample, load_page
from .stage_stats import assemble_stages, counted_flops, timed_generation

DEFAULT_MAX_NEW_TOKENS = 512
FlopsPolicy = Literal["shape", "page", "none"]
WarmupPolicy = Literal["shape", "first", "none"]
Progress = Callable[[int, int, Sample, str], None]  # (samples handled, total, sample, status)
SETTINGS_IDENTITY = ("mode", "prompt", "min_crops", "max_crops", "max_new_tokens", "no_repeat_ngram_size",
                     "logits", "dpi")


@dataclass(frozen=True)
class ProfileSettings:
    """How every page of a dataset run is processed. The SETTINGS_IDENTITY fields must match to resume a run."""

    mode: str = "gundam"
    prompt: str = DEFAULT_PROMPT
    min_crops: int = 2
    max_crops: int = 9
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    no_repeat_ngram_size: int = 20
    logits: Literal["all", "last"] = "all"
    dpi: int = 144
    flops: FlopsPolicy = "shape"
    warmup: WarmupPolicy = "shape"

    def validate(self) -> "ProfileSettings":
        from ..tiling import mode_info

        mode_info(self.mode)  # SpecError (a ValueError) for an unknown mode
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.prompt.count("<image>") != 1:
            raise ValueError("the prompt must contain <image> exactly once "
                             "(e.g. '<image>\\n<|grounding|>Convert the document to markdown.')")
        if not 1 <= self.min_crops <= self.max_crops:
            raise ValueError(f"crop range must satisfy 1 <= min_crops <= max_crops, got {self.min_crops}..{self.max_crops}")
        if self.logits not in ("all", "last"):
            raise ValueError(f"logits must be 'all' or 'last', got {self.logits!r}")
        if self.flops not in ("shape", "page", "none"):
            raise ValueError(f"flops must be shape, page or none, got {self.flops!r}")
        if not 18 <= self.dpi <= 1200:
            raise ValueError(f"dpi must lie in 18..1200, got {self.dpi}")
        if self.warmup not in ("shape", "first", "none"):
            raise ValueError(f"warmup must be shape, first or none, got {self.warmup!r}")
        return self

    def identity(self) -> dict:
        return {k: getattr(self, k) for k in SETTINGS_IDENTITY}

    def to_dict(self) -> dict:
        return asdict(self)


def shape_key(inputs, logits: str) -> tuple:
    """What the cost of vision and prefill depends on: mode, tile grid, prompt length, logits mode."""
    return (inputs.mode, tuple(int(x) for x in inputs.images_spatial_crop[0].tolist()), inputs.seq_len, logits)


# ---------------------------------------------------------------------------------------------- FLOPs
class FlopCache:
    """Counted FLOPs per input shape (see the module docstring)."""

    def __init__(self, session: Session, policy: FlopsPolicy = "shape"):
        self.session = session
        self.policy = policy
        self._by_shape: dict[tuple, dict[str, int]] = {}

    def counted(self, inputs, logits: str) -> tuple[dict[str, int] | None, str]:
        """{sam, clip, projector, prefill, decode_first, decode_second} for these inputs, and where it came from:
        'counted', 'same shape' (reused) or 'not counted'."""
        if self.policy == "none":
            return None, "not counted"
        key = shape_key(inputs, logits)
        if self.policy == "shape" and key in self._by_shape:  # FLOPs follow the shape; routing the page's content
            return {**self._by_shape[key], "routing": None}, "same shape"
        flops = counted_flops(self.session, inputs, logits)
        self._by_shape[key] = flops
        return flops, "counted"


# ---------------------------------------------------------------------------------------------- one page
@dataclass
class PageResult:
    status: str  # done | oom | error
    message: str = ""
    stages: dict[str, dict] = field(default_factory=dict)
    kv_bytes: int | None = None
    resolved: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)


def _detections(text: str) -> dict:
    from ..grounding import parse

    parsed = parse(text)
    return {"blocks": len(parsed.blocks), "labels": parsed.labels(), "problems": len(parsed.problems),
            "boxes": [{"label": b.label, "boxes": [list(map(int, box)) for box in b.boxes]} for b in parsed.blocks]}


def measure_page(session: Session, sample: Sample, settings: ProfileSettings, flop_cache: FlopCache | None = None,
                 warmed: dict | None = None) -> PageResult:
    """Load, preprocess, (warm up,) time and count one page. `warmed` ({input shape: engine state_epoch when it
    was warmed}, updated here) is shared by a run's pages. An unreadable page gives an `error` result; any other
    failure raises (run_dataset records it)."""
    base = {"page": sample.page.name, "pdf_page": sample.page.pdf_page, "epoch": sample.epoch,
            "label": sample.page.label, "source": str(sample.page.path)}
    warmed = {} if warmed is None else warmed
    t0 = time.perf_counter()
    try:
        image = load_page(sample.page, settings.dpi)
    except ImageError as exc:
        return PageResult("error", str(exc).splitlines()[0][:500] or "unreadable page", extra={**base, "failed": "load"})
    inputs = session.prepare(image, settings.prompt, mode=settings.mode, min_crops=settings.min_crops,
                             max_crops=settings.max_crops)
    synchronize(session.device)
    preprocess_s = time.perf_counter() - t0
    gen = dict(no_repeat_ngram_size=settings.no_repeat_ngram_size, logits=settings.logits, memory="loop")
    shape = shape_key(inputs, settings.logits)
    engine = session.engine
    warm = ((settings.warmup == "shape" and warmed.get(shape) != engine.state_epoch)
            or (settings.warmup == "first" and not warmed))
    if warm:
        timed_generation(session, inputs, min(2, settings.max_new_tokens), **gen)
    warmed[shape] = engine.state_epoch  # after the warm-up: what it prepared holds until the epoch moves
    synchronize(session.device)
    from .sweep import collector_paused

    with collector_paused():  # as a sweep's points: no full collection falls into the timed page
        probes = [probe_host_op_s(session.device)]  # the host's speed before and after (runtime/host_speed.py)
        gpu_before = gpu_state.read(session.device)  # and the GPU's clocks (runtime/gpu_state.py; None on a CPU)
        with StageClocks(session.device) as clocks:  # the SM clock of each stage (runtime/gpu_clocks.py)
            timer = clocks.timer()
            t1 = time.perf_counter()
            run = timed_generation(session, inputs, settings.max_new_tokens, timer=timer, **gen)
            generation_s = time.perf_counter() - t1
        gpu_after = gpu_state.read(session.device)
        probes.append(probe_host_op_s(session.device))
    generated = trim_at_eos(run.tokens[0].tolist(), session.spec.eos_token_id)
    try:  # a failing FLOP pass (e.g. out of memory under the counter) must not throw away the timed page
        flops, flops_source = (flop_cache or FlopCache(session, "none")).counted(inputs, settings.logits)
    except Exception as exc:  # noqa: BLE001
        from .sweep import free_memory

        free_memory(session.device)
        flops, flops_source = None, f"failed: {type(exc).__name__}: {exc}".splitlines()[0][:300]

    eos_id = session.spec.eos_token_id
    text = session.tokenizer.decode([t for t in generated if t != eos_id])
    steps = run.steps
    ttft = sum(run.totals.get(s, 0.0) for s in run.timed_stages)
    grid = tuple(int(x) for x in inputs.images_spatial_crop[0].tolist())
    resolved = {"mode": inputs.mode, "grid": grid, "image_size": inputs.image_size, "image_slots": inputs.image_slots,
                "sequence": inputs.seq_len, "text_tokens": inputs.text_tokens, "batch": inputs.batch,
                "decode_steps": len(steps), "dtype": session.dtype, "attn": session.attn_impl,
                "logits": settings.logits}
    extra = {
        **base, "generated_tokens": len(generated), "eos": eos_id in generated, "text": text,
        "detections": _detections(text), "decode_steps_s": steps, "ttft_s": ttft,
        "tpot_s": median(steps) if steps else None, "decode_step_mean_s": sum(steps) / len(steps) if steps else None,
        "preprocess_s": preprocess_s, "generation_s": generation_s, "wall_s": preprocess_s + generation_s,
        "warmed_up_before": warm, "peak_memory_bytes": max(run.peaks.values()) if run.peaks else None,
        "kv_length": run.kv_length, "flops_source": flops_source,
        "engine_state": engine.point_state(inputs.batch),
    }
    host = probe_median(probes)
    if host is not None:
        extra["host_probe_op_s"] = host
    gpu = gpu_state.span(gpu_before, gpu_after)
    if gpu is not None:
        extra["gpu_state"] = gpu
    stage_clocks = clocks.result()
    if stage_clocks:
        extra["stage_clocks"] = stage_clocks
    return PageResult("done", "", assemble_stages([run], flops, decode_step_over="steps"), run.kv_bytes, resolved,
                      extra)


# ---------------------------------------------------------------------------------------------- runs
def create_dataset_run(store: RunStore, session: Session, dataset: Dataset, settings: ProfileSettings,
                       sampling: dict, name: str | None = None, notes: str = "", environment: dict | None = None,
                       meta: dict | None = None) -> str:
    """A new run of kind `dataset`, with the data set, sampling, settings, session and model spec in its meta.
    `environment` (default: captured here) and `meta` (merged) let a scale-out driver record its workers'."""
    from .environment import capture_environment

    settings.validate()
    meta = {"dataset": dataset.describe(), "sampling": dict(sampling), "settings": settings.to_dict(),
            "session": session.describe(), "spec": session.spec.model_dump(mode="json"), **(meta or {})}
    name = name or f"dataset {dataset.source.name} ({settings.mode})"
    return store.create_run("dataset", name, environment or capture_environment(str(session.device)), session.weights,
                            dtype=session.dtype, attn=session.attn_impl, session_mode=session.session_mode, meta=meta,
                            notes=notes)


def check_resume(store: RunStore, run_id: str, session: Session, dataset: Dataset, settings: ProfileSettings) -> None:
    """Raise ValueError unless `run_id` is a dataset run over the same data set, with the same settings and the
    same weights, dtype, attention, session mode and device type (its points would not be comparable otherwise)."""
    run = store.get_run(run_id)  # RunNotFound (a LookupError) when absent
    if run["kind"] != "dataset":
        raise ValueError(f"run {run_id} is a {run['kind']} run, not a dataset run")
    meta = run["meta"]
    problems = []
    old = (meta.get("settings") or {})
    for k, v in settings.identity().items():
        if old.get(k) != v:
            problems.append(f"{k} {old.get(k)!r} -> {v!r}")
    old_source = (meta.get("dataset") or {}).get("source")
    if old_source is not None and str(dataset.source) != old_source:
        problems.append(f"data set {old_source} -> {dataset.source}")
    if run_model(run) != session.family.name:
        problems.append(f"model {run_model(run)} -> {session.family.name}")
    if run["weights"].get("detail") != session.weights.get("detail"):
        problems.append(f"weights {run['weights'].get('detail')!r} -> {session.weights.get('detail')!r}")
    if run["dtype"] != session.dtype:
        problems.append(f"dtype {run['dtype']} -> {session.dtype}")
    if run["attn"] != session.attn_impl:
        problems.append(f"attention {run['attn']} -> {session.attn_impl}")
    old_mode = {"separated": "reference"}.get(run["session_mode"], run["session_mode"])  # runs before the modes
    if old_mode != session.session_mode:
        problems.append(f"session mode {old_mode} -> {session.session_mode}")
    old_device = str(run["environment"].get("device", ""))
    if old_device.split(":")[0] != session.device.type:
        problems.append(f"device {old_device} -> {session.device}")
    if problems:
        raise ValueError(f"cannot resume run {run_id[:8]} with different settings ({'; '.join(problems)}); "
                         "start a new run instead")


def run_dataset(session: Session, store: RunStore, run_id: str, samples: Sequence[Sample], settings: ProfileSettings,
                progress: Progress | None = None, should_stop: Callable[[], bool] | None = None,
                order_check: bool = True) -> dict[str, int]:
    """Measure every sample not yet finished in `run_id`, writing each point as soon as it is measured.
    Returns counts {done, oom, error, skipped, stopped}. An unreadable page or a failing page is recorded and
    the run goes on; an out-of-memory frees memory first. `should_stop` is polled between pages. With
    `order_check`, a run that was not stopped ends with its first page measured again (see the module
    docstring; progress reports it with status "recheck")."""
    from .sweep import failure, free_memory, older_objects_frozen

    settings.validate()
    finished = store.finished_keys(run_id)
    flop_cache = FlopCache(session, settings.flops)
    warmed: dict = {}
    counts = {"done": 0, "oom": 0, "error": 0, "skipped": 0, "stopped": 0}
    total = len(samples)
    session.engine.release()  # what an earlier run kept goes now, not frozen with the rest
    with older_objects_frozen():  # each page's collections then scan only what the run allocated (sweep.py)
        for i, sample in enumerate(samples, 1):
            if should_stop is not None and should_stop():
                counts["stopped"] = total - i + 1
                break
            if point_key(sample.key) in finished:
                counts["skipped"] += 1
                if progress:
                    progress(i, total, sample, "skipped")
                continue
            try:
                with session.lock:
                    result = measure_page(session, sample, settings, flop_cache, warmed)
            except Exception as exc:  # one bad page must not end the run
                status, message = failure(exc)
                result = PageResult(status, message, extra={"page": sample.page.name, "pdf_page": sample.page.pdf_page,
                                                            "epoch": sample.epoch, "label": sample.page.label,
                                                            "source": str(sample.page.path), "failed": "generate"})
            if result.status != "done":
                free_memory(session.device)  # outside the except block, once the traceback has let go of the tensors
            store.put_point(run_id, sample.key, result.status, result.message, result.stages or None, result.kv_bytes,
                            result.resolved or None, result.extra)
            counts[result.status] += 1
            if progress:
                progress(i, total, sample, result.status)
        if order_check and not counts["stopped"]:
            recheck_first_page(session, store, run_id, samples, settings, flop_cache, warmed, progress)
    return counts


def recheck_first_page(session: Session, store: RunStore, run_id: str, samples: Sequence[Sample],
                       settings: ProfileSettings, flop_cache: FlopCache | None = None, warmed: dict | None = None,
                       progress: Progress | None = None) -> dict | None:
    """The order check of a dataset run: its first finished page measured again (warmed up like any page) and
    compared with what is stored; recorded in meta["order_check"]. None when fewer than two pages are done or
    the first page is not among `samples`."""
    from . import order_check as checks
    from .sweep import failure, free_memory

    first = checks.first_point(store, run_id)
    if first is None:
        return None
    key, stored, first_extra = first
    sample = next((s for s in samples if s.key == key), None)
    if sample is None:
        return None
    if progress:
        progress(len(samples), len(samples), sample, "recheck")
    try:
        with session.lock:
            again = measure_page(session, sample, settings, flop_cache, warmed)
    except Exception as exc:  # noqa: BLE001 - the pages are stored; say why the check is missing
        free_memory(session.device)
        return checks.record(store, run_id, {"workload": key, "skipped": failure(exc)[1]})
    if again.status != "done":
        return checks.record(store, run_id, {"workload": key, "skipped": again.message or again.status})
    check = checks.with_gpu_states(checks.compare(stored, again.stages, key), first_extra,
                                   (again.extra or {}).get("gpu_state"))
    return checks.record(store, run_id, check)
