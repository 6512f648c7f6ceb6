"""The profiled session: one model on one device, run by one engine (reference or fast), with prefill and decode
as separate, timed, FLOP-counted stages.

Two generation paths with the same token choice (`generate.next_tokens`) and the same loop (`generate.Greedy`):
* one-shot: HF `generate()`'s call pattern on the reference model (engine.OneShotEngine), whatever the session's
  mode: every step calls the full model with the image arguments; the model runs vision only for the prefill.
  It is the parity yardstick;
* separated: the session's engine: `prefill()` (vision + LM over the prompt) and then decode steps that take a
  token and the cache and nothing else, so no image tensor can reach a decode step.
A separated run carries a verification report (verify.py) that checks, rather than assumes, that the two agree.
"""
from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import median

import torch

from ..engines import SESSION_MODES, EngineSpec
from ..registry import OfFamily
from ..spec import ModelSpec
from .engine import OneShotEngine, build_engine
from .flops import VISION_STAGES, count_stage_flops
from .generate import FirstToken, Greedy
from .tokens import trim_at_eos
from .timing import StageTimer
from .verify import CallRecorder, verification

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
DEFAULT_PROMPT = "<image>\n<|grounding|>Convert the document to markdown."

__all__ = ["GenerationResult", "PrefillResult", "SESSION_MODES", "Session", "TORCH_DTYPES", "VISION_STAGES",
           "resolve_device"]


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("CUDA was requested but no CUDA GPU is available (use --device cpu)")
    return torch.device(device)


@dataclass
class PrefillResult:
    logits: torch.Tensor  # float32 [B, T_logits, V] (a copy: the engine's buffer is reused)
    cache: object  # the engine's cache: length, history, bytes_used, bytes_allocated
    prompt_length: int
    timings: dict[str, float]  # the vision stages (sam, clip or encoder, projector), prefill (seconds)
    peak_memory: dict[str, int] = field(default_factory=dict)


@dataclass
class GenerationResult:
    path: str  # "one-shot" | "separated"
    input_ids: list[list[int]]
    generated_ids: list[list[int]]  # per row, up to and including EOS
    texts: list[str]
    timings: dict  # stage seconds; decode_steps list; ttft_s; tpot_s; total_s
    verification: dict | None = None
    session_mode: str = "reference"  # the engine of the separated path ("one-shot" always runs the reference)

    def to_dict(self) -> dict:
        return asdict(self)


class Session(OfFamily):
    """One model on one device and the engine that runs it. `lock` serialises GPU work between callers (e.g.
    browser tabs); sessions made with `with_mode` share the model, the tokenizer and the lock."""

    def __init__(self, model: torch.nn.Module, spec: ModelSpec, tokenizer, device: torch.device, dtype: str,
                 weights: dict, attn_impl: str = "sdpa", session_mode: str = "reference",
                 engine_options: dict | None = None, lock: threading.Lock | None = None):
        # the engine's one validated description (a SpecError, a ValueError, names a bad mode or option)
        self.engine_spec = EngineSpec.of(session_mode, engine_options)
        from ..registry import family_of, fast_engine_models

        if session_mode == "fast" and not family_of(spec).fast_engine:
            raise ValueError(f"the fast engine runs {', '.join(fast_engine_models())} only; run "
                             f"{family_of(spec).label} in the reference session mode")
        self.model = model.eval()
        self.spec = spec
        self.tokenizer = tokenizer
        self.device = device
        self.dtype = dtype
        self.weights = weights  # {"source": "checkpoint"|"synthetic", "detail": ..., "synthetic": bool}
        self.attn_impl = attn_impl
        self.session_mode = session_mode
        self.engine_options = self.engine_spec.non_default()
        self.lock = lock or threading.Lock()
        self._engine = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def load(cls, checkpoint: str | Path | None = None, synthetic: str | None = None, seed: int = 0,
             device: str = "auto", dtype: str = "bfloat16", attn: str = "sdpa",
             spec_overrides: dict | None = None, session_mode: str = "reference",
             engine_options: dict | None = None, model: str | None = None) -> "Session":
        """A session over a local checkpoint folder (its config.json names the model family; `model`, when given,
        must agree), or over seeded random weights of a preset ('tiny'|'full') of `model` (default DeepSeek-OCR)."""
        from ..model.checkpoint import load_model, synthetic_model
        from ..registry import DEFAULT_MODEL, get_family
        from .tokenizer import load_tokenizer

        if dtype not in TORCH_DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(TORCH_DTYPES)}")
        EngineSpec.of(session_mode, engine_options)  # a bad mode or option fails before any weights load
        dev = resolve_device(device)
        if dev.type == "cpu" and dtype == "float16":
            raise ValueError("float16 on the CPU is not supported; use bfloat16 or float32")
        family = get_family(model)
        if checkpoint is not None:
            net, spec, info = load_model(checkpoint, dtype=TORCH_DTYPES[dtype], device=dev, attn_impl=attn)
            if model is not None and spec.family != family.name:
                raise ValueError(f"{checkpoint} holds a {get_family(spec.family).label} checkpoint, not {family.label}")
            weights = {"source": "checkpoint", "detail": str(Path(checkpoint).resolve()), "synthetic": False}
            tokenizer = load_tokenizer(checkpoint)
        elif synthetic is not None:
            if synthetic not in family.presets:
                raise ValueError(f"unknown preset {synthetic!r}; choose one of {', '.join(family.presets)}")
            spec = family.preset(synthetic)
            if spec_overrides:
                spec = spec.replace(**spec_overrides)
            net = synthetic_model(spec, seed=seed, dtype=TORCH_DTYPES[dtype], device=dev, attn_impl=attn)
            # the default model's detail stays as it was, so its stored runs resume; another model is named
            named = "" if family.name == DEFAULT_MODEL else f"{family.label} "
            weights = {"source": "synthetic", "detail": f"{named}preset {synthetic}, seed {seed} (random weights)",
                       "synthetic": True}
            tokenizer = load_tokenizer(None)
        else:
            raise ValueError("give a checkpoint folder or a synthetic preset")
        weights["tokenizer"] = tokenizer.label
        weights["fallback_tokenizer"] = tokenizer.is_fallback
        return cls(net, spec, tokenizer, dev, dtype, weights, attn, session_mode, engine_options)

    def with_mode(self, session_mode: str, **engine_options) -> "Session":
        """A session of `session_mode` over this session's model, tokenizer and lock (no copy of the model)."""
        return Session(self.model, self.spec, self.tokenizer, self.device, self.dtype, dict(self.weights),
                       self.attn_impl, session_mode, engine_options, self.lock)

    @property
    def engine(self):
        """The engine, built on first use (the fast engine lays out its weights then; errors surface here)."""
        if self._engine is None:
            self._engine = build_engine(self.engine_spec, self.model)
        return self._engine

    @property
    def torch_dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.dtype]

    def describe(self) -> dict:
        """What runs where, for the UI and every exported result."""
        n_params = sum(p.numel() for p in self.model.parameters())
        engine = self._engine.describe() if self._engine is not None else {"options": self.engine_options}
        return {"model": self.family.name, "device": str(self.device), "dtype": self.dtype, "attn": self.attn_impl,
                "session_mode": self.session_mode, "parameters": n_params, **self.weights,
                "cpu_fallback": self.device.type == "cpu", "engine": engine,
                "engine_spec": self.engine_spec.to_dict()}  # what the time model predicts this run's engine with

    # ------------------------------------------------------------------ inputs
    def prepare(self, image=None, prompt: str = DEFAULT_PROMPT, mode: str | None = None,
                min_crops: int | None = None, max_crops: int | None = None, batch: int = 1):
        """Page image (path, bytes or PIL image) and prompt -> model inputs on this session's device. The mode
        defaults to the model's default (gundam, dynamic) and must be one of the model's; the crop range to the
        mode's."""
        from .inputs import prepare_inputs

        mode = self.family.default_mode if mode is None else mode
        self.family.mode(mode)  # a mode of the other model is an error naming this model's modes
        inputs = prepare_inputs(image, prompt, self.tokenizer, mode=mode, min_crops=min_crops,
                                max_crops=max_crops, dtype=self.torch_dtype, batch=batch)
        return self.to_device(inputs)

    def to_device(self, inputs):
        """Inputs on this session's device, pixels in its dtype."""
        return inputs.to(self.device, self.torch_dtype)

    # ------------------------------------------------------------------ stages
    @torch.no_grad()
    def prefill(self, inputs, logits: str = "last", upto: int | None = None, timer: StageTimer | None = None,
                room: int = 0) -> PrefillResult:
        """Vision + LM over the prompt (or its first `upto` tokens). Returns a copy of the logits and the cache."""
        timer = timer or StageTimer(self.device)
        out, cache = self.engine.prefill(inputs, logits=logits, upto=upto, timer=timer, room=room)
        times = timer.totals()
        return PrefillResult(out.clone(), cache, cache.length,
                             {k: times.get(k, 0.0) for k in (*self.vision_stages, "prefill")},
                             dict(timer.peak_memory))

    @torch.no_grad()
    def decode_step(self, token: torch.Tensor, cache) -> torch.Tensor:
        """One decode step: token [B] and the cache only; vision cannot run. Returns a copy of the logits [B, V]."""
        return self.engine.decode_step(token, cache).clone()

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate(self, inputs, max_new_tokens: int = 8192, no_repeat_ngram_size: int = 20,
                 first_token: FirstToken = "prefill", logits: str = "all") -> GenerationResult:
        """The separated path through this session's engine, without the one-shot comparison."""
        return self._run(self.engine, "separated", inputs, max_new_tokens, no_repeat_ngram_size, logits,
                         first_token)[0]

    @torch.no_grad()
    def generate_one_shot(self, inputs, max_new_tokens: int = 8192, no_repeat_ngram_size: int = 20,
                          logits: str = "all") -> GenerationResult:
        """HF `generate()` semantics on the reference model (whatever this session's mode): each step is one model
        call with the image arguments; the prompt's step is the `prefill` stage (NVTX range), later ones
        `decode`."""
        result, _, recorder = self._run(OneShotEngine(self.model), "one-shot", inputs, max_new_tokens,
                                        no_repeat_ngram_size, logits, "prefill")
        result.session_mode = "reference"
        result.timings["vision_calls"] = dict(recorder.vision_calls)
        return result

    @torch.no_grad()
    def generate_separated(self, inputs, max_new_tokens: int = 8192, no_repeat_ngram_size: int = 20,
                           first_token: FirstToken = "prefill", logits: str = "all",
                           reference: GenerationResult | None = None) -> GenerationResult:
        """The separated path with its verification against `reference` (a one-shot result; one is run when
        none is given)."""
        result, gen, recorder = self._run(self.engine, "separated", inputs, max_new_tokens, no_repeat_ngram_size,
                                          logits, first_token)
        kv_length = int(gen.cache.length)  # before a one-shot run can reuse a fast engine's buffers
        del gen
        if reference is None:
            reference = self.generate_one_shot(inputs, max_new_tokens, no_repeat_ngram_size, logits)
        prefill_length = inputs.input_ids.shape[1] - (first_token == "redecode")
        result.verification = verification(result, reference, recorder, first_token, prefill_length,
                                           result.timings["decode_steps_run"], kv_length,
                                           result.timings["peak_memory"])
        return result

    def _run(self, engine, path: str, inputs, max_new_tokens: int, ngram: int, logits: str,
             first_token: FirstToken) -> tuple[GenerationResult, Greedy, CallRecorder]:
        timer = StageTimer(self.device)
        recorder = CallRecorder(self.model, timer)
        gen = Greedy(engine, inputs, max_new_tokens, ngram, timer=timer, logits=logits, first_token=first_token)
        try:
            tokens = gen.run()
        finally:
            recorder.close()
        return self._result(path, inputs, tokens, timer, gen.decode_steps), gen, recorder

    def _result(self, path: str, inputs, generated: list[torch.Tensor], timer: StageTimer,
                decode_steps: int) -> GenerationResult:
        totals = timer.totals()
        steps = timer.per_item("decode")  # one time per decode step, also where one launch holds several
        ttft = sum(totals.get(s, 0.0) for s in (*self.vision_stages, "prefill"))
        gen = torch.stack(generated, 1).tolist() if generated else [[] for _ in range(inputs.input_ids.shape[0])]
        eos = self.spec.eos_token_id
        rows = [trim_at_eos(row, eos) for row in gen]
        texts = [self.tokenizer.decode([t for t in row if t != eos]) for row in rows]
        timings = {**{k: totals.get(k, 0.0) for k in (*self.vision_stages, "prefill")},
                   "decode": totals.get("decode", 0.0), "decode_steps": steps, "decode_steps_run": decode_steps,
                   "ttft_s": ttft, "tpot_s": median(steps) if steps else None, "total_s": sum(totals.values()),
                   "peak_memory": dict(timer.peak_memory)}
        return GenerationResult(path, inputs.input_ids.tolist(), rows, texts, timings,
                                session_mode=self.session_mode)

    # ------------------------------------------------------------------ FLOPs (separate pass)
    def count_stage_flops(self, inputs, logits: str = "all", decode_steps: int = 1) -> dict:
        """The model's FLOPs per stage, counted in a separate pass (see flops.count_stage_flops)."""
        return count_stage_flops(self.model, inputs, logits, decode_steps)
