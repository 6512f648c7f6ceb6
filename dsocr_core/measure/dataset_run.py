"""Dataset runs: every sampled page through the session, timed stage by stage, stored point by point.

Per page: load (PDF pages rendered at the data set's dpi), preprocess with the run's mode and crop range, then a
timed greedy generation on the separated path: `Session.prefill` (sam, clip, projector and prefill timed by the
StageTimer) and a loop of `Session.decode_step`, each step its own `decode` stage, with the same token choice as
every other path (`generation.next_tokens`, n-gram ban included). No one-shot reference run is made: that is
the parity work's business, and it would double the cost of every page.

What is not timed: loading and preprocessing are timed apart (`preprocess_s`); an untimed warm-up generation
(2 tokens) runs before the first page of every new input shape (mode, tile grid, prompt length) when
`warmup="shape"` (the default), so each timed page sees warmed-up kernels, as a serving process would;
FLOPs are counted in a separate FlopCounterMode pass after timing.

FLOPs (`flops="shape"`, the default): the counting pass (vision, prefill and two decode steps) runs once per
distinct input shape (mode, grid, prompt length, logits mode) and is reused for every later page of that shape;
vision and prefill FLOPs depend on nothing else. Decode FLOPs are affine in the context length (attention
grows by a constant per cached token; the top-k experts do the same work whatever they are), so K steps from a
prompt of length T cost K*f(T) + (f(T+1) - f(T)) * K*(K-1)/2, exact, from the two counted steps.
`flops="page"` counts every page (slower, same numbers); `flops="none"` skips counting.

Store layout (a run of kind `dataset`): one point per sample, key {"page", "pdf_page", "epoch"} (see
dataset.Sample.key), status done | oom | error. `resolved` holds mode, grid, image size, image slots, prompt
length (`sequence`), text tokens, batch 1 and decode_steps (decode steps actually run = generated tokens - 1,
the first token coming from the prefill). Stages: sam, clip, projector, vision, prefill, decode (the page's
summed decode time) and decode_step (statistics over the page's steps); each with its FLOPs and, on CUDA, peak
memory. `extra`: text, detections summary, decode_steps_s (every step), generated_tokens, eos, ttft_s,
tpot_s (median step, as Session), preprocess_s, generation_s, wall_s (preprocess + generation), flops_source
(counted | same shape | not counted | failed: <why>; a failed FLOP pass keeps the page's timings).
A resumed run skips points already done or oom; error points are tried again.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from statistics import median
from typing import Callable, Literal, Sequence

import torch

from .datasets import Dataset, Sample, load_page
from ..runtime.generate import next_tokens
from ..runtime.inputs import DEFAULT_PROMPT, ImageError
from ..runtime.session import VISION_STAGES, Session
from ..results.store import RunStore, point_key, stage_stats
from ..runtime.timing import StageTimer, synchronize

DEFAULT_MAX_NEW_TOKENS = 512
FlopsPolicy = Literal["shape", "page", "none"]
WarmupPolicy = Literal["shape", "first", "none"]
Progress = Callable[[int, int, Sample, str], None]  # (samples handled, total, sample, status)
TIMED_STAGES = (*VISION_STAGES, "prefill")
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


# ---------------------------------------------------------------------------------------------- one generation
@dataclass
class GenerationTrace:
    """One timed greedy generation of one row."""

    generated: list[int]  # new token ids, up to and including EOS
    stage_s: dict[str, float]  # sam, clip, projector, prefill, decode (sum of steps)
    decode_steps_s: list[float]
    peak_memory: dict[str, int]  # CUDA only: per stage, bytes
    kv_bytes: int
    kv_length: int
    eos: bool


@torch.no_grad()
def generate_timed(session: Session, inputs, max_new_tokens: int, no_repeat_ngram_size: int = 20,
                   logits: str = "all", timer: StageTimer | None = None) -> GenerationTrace:
    """generate_separated without the one-shot verification: prefill (vision stages timed inside), then one
    `decode` stage per decode_step. Batch row 0 only. Decode memory is the peak over the whole decode loop
    (one reset before it, one read after), so no decode step pays a synchronisation for memory tracking."""
    timer = timer or StageTimer(session.device)
    spec = session.spec
    history = inputs.input_ids
    finished = torch.zeros(history.shape[0], dtype=torch.bool, device=session.device)
    pre = session.prefill(inputs, logits=logits, timer=timer)
    # copy the last position out: a view would keep the whole [B, T, vocab] logits alive through decoding
    step_logits, cache = pre.logits[:, -1].clone(), pre.cache
    del pre
    cuda = session.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(session.device)
        torch.cuda.reset_peak_memory_stats(session.device)
    generated: list[torch.Tensor] = []
    for step in range(max_new_tokens):
        token = next_tokens(step_logits, history, no_repeat_ngram_size, finished, spec.pad_token_id)
        generated.append(token)
        history = torch.cat([history, token[:, None]], 1)
        finished |= token == spec.eos_token_id
        if bool(finished.all()) or step == max_new_tokens - 1:
            break
        with timer.stage("decode"):
            step_logits, cache = session.decode_step(token, cache)
    marks = timer.finish()
    peak = dict(timer.peak_memory)
    steps = [s for name, s in marks if name == "decode"]
    if cuda and steps:
        torch.cuda.synchronize(session.device)
        peak["decode"] = int(torch.cuda.max_memory_allocated(session.device))
    totals = {name: 0.0 for name in (*TIMED_STAGES, "decode")}
    for name, seconds in marks:
        totals[name] = totals.get(name, 0.0) + seconds
    row = torch.stack(generated, 1)[0].tolist()
    eos = spec.eos_token_id in row
    if eos:
        row = row[: row.index(spec.eos_token_id) + 1]
    return GenerationTrace(row, totals, steps, peak, int(cache.nbytes), int(cache.length), eos)


def shape_key(inputs, logits: str) -> tuple:
    """What the cost of vision and prefill depends on: mode, tile grid, prompt length, logits mode."""
    return (inputs.mode, tuple(int(x) for x in inputs.images_spatial_crop[0].tolist()), inputs.seq_len, logits)


# ---------------------------------------------------------------------------------------------- FLOPs
def decode_flops_total(first: int, second: int, steps: int) -> int:
    """FLOPs of `steps` decode steps whose first two cost `first` and `second` (affine in the context)."""
    if steps <= 0:
        return 0
    return int(steps * first + (second - first) * steps * (steps - 1) // 2)


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
        if self.policy == "shape" and key in self._by_shape:
            return self._by_shape[key], "same shape"
        out = self.session.count_stage_flops(inputs, logits=logits, decode_steps=2)
        flops = {s: int(out[s]["flops"]) for s in TIMED_STAGES}
        first, second = (int(x) for x in out["decode"]["per_step"])
        flops |= {"decode_first": first, "decode_second": second}
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


def _stages(trace: GenerationTrace, flops: dict[str, int] | None) -> dict[str, dict]:
    stages: dict[str, dict] = {}
    for s in TIMED_STAGES:
        stages[s] = stage_stats([trace.stage_s[s]])
    stages["vision"] = stage_stats([sum(trace.stage_s[s] for s in VISION_STAGES)])
    k = len(trace.decode_steps_s)
    if k:
        stages["decode"] = stage_stats([sum(trace.decode_steps_s)])
        stages["decode_step"] = stage_stats(trace.decode_steps_s)  # over this page's steps
    for s, peak in trace.peak_memory.items():
        if s in stages:
            stages[s]["peak_memory_bytes"] = peak
    if trace.peak_memory:
        stages["vision"]["peak_memory_bytes"] = max(trace.peak_memory.get(s, 0) for s in VISION_STAGES)
    if flops is not None:
        for s in TIMED_STAGES:
            stages[s]["flops"] = flops[s]
        stages["vision"]["flops"] = sum(flops[s] for s in VISION_STAGES)
        if k:
            stages["decode"]["flops"] = decode_flops_total(flops["decode_first"], flops["decode_second"], k)
            stages["decode_step"]["flops"] = flops["decode_first"]
    return stages


def measure_page(session: Session, sample: Sample, settings: ProfileSettings, flop_cache: FlopCache | None = None,
                 warmed: set | None = None) -> PageResult:
    """Load, preprocess, (warm up,) time and count one page. An unreadable page gives an `error` result; any
    other failure raises (run_dataset records it)."""
    base = {"page": sample.page.name, "pdf_page": sample.page.pdf_page, "epoch": sample.epoch,
            "label": sample.page.label, "source": str(sample.page.path)}
    warmed = set() if warmed is None else warmed
    t0 = time.perf_counter()
    try:
        image = load_page(sample.page, settings.dpi)
    except ImageError as exc:
        return PageResult("error", str(exc).splitlines()[0][:500] or "unreadable page", extra={**base, "failed": "load"})
    inputs = session.prepare(image, settings.prompt, mode=settings.mode, min_crops=settings.min_crops,
                             max_crops=settings.max_crops)
    synchronize(session.device)
    preprocess_s = time.perf_counter() - t0
    gen = dict(no_repeat_ngram_size=settings.no_repeat_ngram_size, logits=settings.logits)
    shape = shape_key(inputs, settings.logits)
    warm = (settings.warmup == "shape" and shape not in warmed) or (settings.warmup == "first" and not warmed)
    if warm:
        generate_timed(session, inputs, min(2, settings.max_new_tokens), **gen)
    warmed.add(shape)
    synchronize(session.device)
    t1 = time.perf_counter()
    trace = generate_timed(session, inputs, settings.max_new_tokens, **gen)
    generation_s = time.perf_counter() - t1
    try:  # a failing FLOP pass (e.g. out of memory under the counter) must not throw away the timed page
        flops, flops_source = (flop_cache or FlopCache(session, "none")).counted(inputs, settings.logits)
    except Exception as exc:  # noqa: BLE001
        from .sweep import free_memory

        free_memory(session.device)
        flops, flops_source = None, f"failed: {type(exc).__name__}: {exc}".splitlines()[0][:300]

    eos_id = session.spec.eos_token_id
    text = session.tokenizer.decode([t for t in trace.generated if t != eos_id])
    steps = trace.decode_steps_s
    ttft = sum(trace.stage_s[s] for s in TIMED_STAGES)
    grid = tuple(int(x) for x in inputs.images_spatial_crop[0].tolist())
    resolved = {"mode": inputs.mode, "grid": grid, "image_size": inputs.image_size, "image_slots": inputs.image_slots,
                "sequence": inputs.seq_len, "text_tokens": inputs.text_tokens, "batch": inputs.batch,
                "decode_steps": len(steps), "dtype": session.dtype, "attn": session.attn_impl,
                "logits": settings.logits}
    extra = {
        **base, "generated_tokens": len(trace.generated), "eos": trace.eos, "text": text,
        "detections": _detections(text), "decode_steps_s": steps, "ttft_s": ttft,
        "tpot_s": median(steps) if steps else None, "decode_step_mean_s": sum(steps) / len(steps) if steps else None,
        "preprocess_s": preprocess_s, "generation_s": generation_s, "wall_s": preprocess_s + generation_s,
        "warmed_up_before": warm, "peak_memory_bytes": max(trace.peak_memory.values()) if trace.peak_memory else None,
        "kv_length": trace.kv_length, "flops_source": flops_source,
    }
    return PageResult("done", "", _stages(trace, flops), trace.kv_bytes, resolved, extra)


# ---------------------------------------------------------------------------------------------- runs
def create_dataset_run(store: RunStore, session: Session, dataset: Dataset, settings: ProfileSettings,
                       sampling: dict, name: str | None = None, notes: str = "") -> str:
    """A new run of kind `dataset`, with the data set, sampling, settings, session and model spec in its meta."""
    from .environment import capture_environment

    settings.validate()
    meta = {"dataset": dataset.describe(), "sampling": dict(sampling), "settings": settings.to_dict(),
            "session": session.describe(), "spec": session.spec.model_dump(mode="json")}
    name = name or f"dataset {dataset.source.name} ({settings.mode})"
    return store.create_run("dataset", name, capture_environment(str(session.device)), session.weights,
                            dtype=session.dtype, attn=session.attn_impl, session_mode="separated", meta=meta,
                            notes=notes)


def check_resume(store: RunStore, run_id: str, session: Session, dataset: Dataset, settings: ProfileSettings) -> None:
    """Raise ValueError unless `run_id` is a dataset run over the same data set, with the same settings and the
    same weights, dtype, attention and device type (its points would not be comparable otherwise)."""
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
    if run["weights"].get("detail") != session.weights.get("detail"):
        problems.append(f"weights {run['weights'].get('detail')!r} -> {session.weights.get('detail')!r}")
    if run["dtype"] != session.dtype:
        problems.append(f"dtype {run['dtype']} -> {session.dtype}")
    if run["attn"] != session.attn_impl:
        problems.append(f"attention {run['attn']} -> {session.attn_impl}")
    old_device = str(run["environment"].get("device", ""))
    if old_device.split(":")[0] != session.device.type:
        problems.append(f"device {old_device} -> {session.device}")
    if problems:
        raise ValueError(f"cannot resume run {run_id[:8]} with different settings ({'; '.join(problems)}); "
                         "start a new run instead")


def run_dataset(session: Session, store: RunStore, run_id: str, samples: Sequence[Sample], settings: ProfileSettings,
                progress: Progress | None = None, should_stop: Callable[[], bool] | None = None) -> dict[str, int]:
    """Measure every sample not yet finished in `run_id`, writing each point as soon as it is measured.
    Returns counts {done, oom, error, skipped, stopped}. An unreadable page or a failing page is recorded and
    the run goes on; an out-of-memory frees memory first. `should_stop` is polled between pages."""
    from .sweep import failure, free_memory

    settings.validate()
    finished = store.finished_keys(run_id)
    flop_cache = FlopCache(session, settings.flops)
    warmed: set = set()
    counts = {"done": 0, "oom": 0, "error": 0, "skipped": 0, "stopped": 0}
    total = len(samples)
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
    return counts
