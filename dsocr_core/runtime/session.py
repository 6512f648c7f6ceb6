"""The profiled session: one model on one device, prefill and decode as separate, timed, FLOP-counted stages.

Two generation paths with the same token choice (`generation.next_tokens`):
* one-shot: like HF `generate()`: every step calls the full model with the image arguments; the model runs
  vision only when the step has more than one token (the prefill);
* separated: `prefill()` (vision + LM over the prompt) and then `decode_step()` calls that take a token and
  the cache and nothing else, so no image tensor can reach a decode step.
A separated run carries a verification report that checks, rather than assumes, that the two agree.
"""
from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import median
from typing import Literal

import torch

from .flops import count_flops, model_counter, module_flops
from .generate import next_tokens
from ..spec import ModelSpec
from .timing import StageTimer

FirstToken = Literal["prefill", "redecode"]
VISION_STAGES = ("sam", "clip", "projector")
TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("CUDA was requested but no CUDA GPU is available (use --device cpu)")
    return torch.device(device)


@dataclass
class PrefillResult:
    logits: torch.Tensor  # float32 [B, T_logits, V]
    cache: object  # model KVCache
    prompt_length: int
    timings: dict[str, float]  # sam, clip, projector, prefill (seconds)
    peak_memory: dict[str, int] = field(default_factory=dict)


@dataclass
class GenerationResult:
    path: str  # "one-shot" | "separated"
    input_ids: list[list[int]]
    generated_ids: list[list[int]]  # per row, up to and including EOS
    texts: list[str]
    timings: dict  # stage seconds; decode_steps list; ttft_s; tpot_s; total_s
    verification: dict | None = None

    def to_dict(self) -> dict:
        return asdict(self)


class _CallRecorder:
    """Counts calls of the vision modules and image arguments reaching the model, per phase."""

    def __init__(self, model: torch.nn.Module):
        self.phase = "idle"
        self.vision_calls: dict[str, int] = {}
        self.image_args: dict[str, int] = {}
        m = model.model
        self._handles = [mod.register_forward_pre_hook(self._on_vision)
                         for mod in (m.sam_model, m.vision_model, m.projector)]
        self._handles.append(model.register_forward_pre_hook(self._on_model, with_kwargs=True))

    def _on_vision(self, module, args):
        self.vision_calls[self.phase] = self.vision_calls.get(self.phase, 0) + 1

    def _on_model(self, module, args, kwargs):
        if kwargs.get("images") is not None:
            self.image_args[self.phase] = self.image_args.get(self.phase, 0) + 1

    def close(self) -> None:
        for h in self._handles:
            h.remove()


class Session:
    """Holds one model on one device. `lock` serialises GPU work between callers (e.g. browser tabs)."""

    session_mode = "reference"  # HF-like semantics; dsocr_core.fast.FastSession is the "fast" mode

    def __init__(self, model: torch.nn.Module, spec: ModelSpec, tokenizer, device: torch.device,
                 dtype: str, weights: dict, attn_impl: str = "sdpa"):
        self.model = model.eval()
        self.spec = spec
        self.tokenizer = tokenizer
        self.device = device
        self.dtype = dtype
        self.weights = weights  # {"source": "checkpoint"|"synthetic", "detail": ..., "synthetic": bool}
        self.attn_impl = attn_impl
        self.lock = threading.Lock()

    # ------------------------------------------------------------------ construction
    @classmethod
    def load(cls, checkpoint: str | Path | None = None, synthetic: str | None = None, seed: int = 0,
             device: str = "auto", dtype: str = "bfloat16", attn: str = "sdpa",
             spec_overrides: dict | None = None) -> "Session":
        """A session over a local checkpoint folder, or over seeded random weights of a preset ('tiny'|'full')."""
        from ..model.checkpoint import load_model, synthetic_model
        from ..spec import PRESETS
        from .tokenizer import load_tokenizer

        if dtype not in TORCH_DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(TORCH_DTYPES)}")
        dev = resolve_device(device)
        if dev.type == "cpu" and dtype == "float16":
            raise ValueError("float16 on the CPU is not supported; use bfloat16 or float32")
        if checkpoint is not None:
            model, spec, info = load_model(checkpoint, dtype=TORCH_DTYPES[dtype], device=dev, attn_impl=attn)
            weights = {"source": "checkpoint", "detail": str(Path(checkpoint).resolve()), "synthetic": False}
            tokenizer = load_tokenizer(checkpoint)
        elif synthetic is not None:
            if synthetic not in PRESETS:
                raise ValueError(f"unknown preset {synthetic!r}; choose one of {', '.join(PRESETS)}")
            spec = PRESETS[synthetic]()
            if spec_overrides:
                spec = spec.replace(**spec_overrides)
            model = synthetic_model(spec, seed=seed, dtype=TORCH_DTYPES[dtype], device=dev, attn_impl=attn)
            weights = {"source": "synthetic", "detail": f"preset {synthetic}, seed {seed} (random weights)",
                       "synthetic": True}
            tokenizer = load_tokenizer(None)
        else:
            raise ValueError("give a checkpoint folder or a synthetic preset")
        weights["tokenizer"] = tokenizer.label
        weights["fallback_tokenizer"] = tokenizer.is_fallback
        return cls(model, spec, tokenizer, dev, dtype, weights, attn)

    @property
    def torch_dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.dtype]

    def describe(self) -> dict:
        """What runs where, for the UI and every exported result."""
        n_params = sum(p.numel() for p in self.model.parameters())
        return {"device": str(self.device), "dtype": self.dtype, "attn": self.attn_impl,
                "session_mode": self.session_mode, "parameters": n_params, **self.weights,
                "cpu_fallback": self.device.type == "cpu"}

    # ------------------------------------------------------------------ inputs
    def prepare(self, image=None, prompt: str = "<image>\n<|grounding|>Convert the document to markdown.",
                mode: str = "gundam", min_crops: int = 2, max_crops: int = 9, batch: int = 1):
        """Page image (path, bytes or PIL image) and prompt -> model inputs on this session's device."""
        from .inputs import prepare_inputs

        inputs = prepare_inputs(image, prompt, self.tokenizer, mode=mode, min_crops=min_crops,
                                max_crops=max_crops, dtype=self.torch_dtype, batch=batch)
        return self.to_device(inputs)

    def to_device(self, inputs):
        """Inputs on this session's device, pixels in its dtype."""
        return inputs.to(self.device, self.torch_dtype)

    # ------------------------------------------------------------------ stages
    def _vision(self, inputs, timer: StageTimer) -> list[torch.Tensor]:
        """The model's own vision code (the one one-shot generation runs), with sam/clip/projector timed."""
        def stage(name: str):
            return timer.stage(name, track_memory=True)

        return self.model.model.vision_embeddings(inputs.images, inputs.images_spatial_crop, stage=stage)

    @torch.no_grad()
    def prefill(self, inputs, logits: str = "all", upto: int | None = None,
                timer: StageTimer | None = None) -> PrefillResult:
        """Vision + LM over the prompt (or its first `upto` tokens). Returns logits and the KV cache."""
        timer = timer or StageTimer(self.device)
        ids = inputs.input_ids if upto is None else inputs.input_ids[:, :upto]
        mask = inputs.images_seq_mask if upto is None else inputs.images_seq_mask[:, :upto]
        embeds = self._vision(inputs, timer)
        with timer.stage("prefill", track_memory=True):
            x = self.model.model.embed(ids, mask, embeds)
            out, cache = self.model.forward_lm(x, cache=None, logits=logits)
        times = timer.totals()
        return PrefillResult(out, cache, ids.shape[1], {k: times.get(k, 0.0) for k in (*VISION_STAGES, "prefill")},
                             dict(timer.peak_memory))

    @torch.no_grad()
    def decode_step(self, token: torch.Tensor, cache) -> tuple[torch.Tensor, object]:
        """One decode step: token [B] and the cache only. Vision cannot run. Returns logits [B, V] (float32)."""
        out, cache = self.model(input_ids=token.view(-1, 1), cache=cache, logits="last")
        return out[:, -1], cache

    @torch.no_grad()
    def decode(self, n: int, prefill: PrefillResult, first_token: torch.Tensor | None = None,
               timer: StageTimer | None = None) -> tuple[torch.Tensor, list[float]]:
        """n greedy decode steps without stopping at EOS (for measurement). Returns tokens [B, n] and step times."""
        timer = timer or StageTimer(self.device)
        token = prefill.logits[:, -1].argmax(-1) if first_token is None else first_token
        cache, tokens = prefill.cache, []
        for _ in range(n):
            with timer.stage("decode"):
                logits, cache = self.decode_step(token, cache)
                token = logits.argmax(-1)
            tokens.append(token)
        steps = [s for name, s in timer.finish() if name == "decode"]
        return torch.stack(tokens, 1) if tokens else torch.empty(0), steps[-n:] if n else []

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate_one_shot(self, inputs, max_new_tokens: int = 8192, no_repeat_ngram_size: int = 20,
                          logits: str = "all") -> GenerationResult:
        """HF `generate()` semantics: each step is one model call with the image arguments; the first step
        (the prompt) runs vision and is marked by its own NVTX range `prefill`, later steps `decode`."""
        recorder = _CallRecorder(self.model)
        timer = StageTimer(self.device)
        history = inputs.input_ids
        finished = torch.zeros(history.shape[0], dtype=torch.bool, device=self.device)
        step_ids, cache, generated = history, None, []
        try:
            for step in range(max_new_tokens):
                name = "prefill" if step == 0 else "decode"
                recorder.phase = name
                with timer.stage(name, track_memory=True):
                    # like generate(): the image arguments go with every step; the model runs vision
                    # only for a step of more than one token
                    out, cache = self.model(input_ids=step_ids, images=inputs.images,
                                            images_seq_mask=inputs.images_seq_mask,
                                            images_spatial_crop=inputs.images_spatial_crop, cache=cache,
                                            logits=logits if step == 0 else "last")
                    token = next_tokens(out[:, -1], history, no_repeat_ngram_size, finished,
                                        self.spec.pad_token_id)
                generated.append(token)
                history = torch.cat([history, token[:, None]], 1)
                finished |= token == self.spec.eos_token_id
                if bool(finished.all()):
                    break
                step_ids = token[:, None]
        finally:
            recorder.close()
        result = self._result("one-shot", inputs, generated, timer)
        result.timings["vision_calls"] = dict(recorder.vision_calls)
        return result

    @torch.no_grad()
    def generate_separated(self, inputs, max_new_tokens: int = 8192, no_repeat_ngram_size: int = 20,
                           first_token: FirstToken = "prefill", logits: str = "all",
                           reference: GenerationResult | None = None) -> GenerationResult:
        """prefill() then a loop of decode_step() with the same token choice as the one-shot path.

        first_token "prefill": the first new token comes from the prefill's last-position logits (what
        `generate()` does). "redecode": the prefill stops one token short and the last prompt token is fed
        as the first decode step. The verification compares with `reference` (a one-shot result), running
        one if none is given."""
        recorder = _CallRecorder(self.model)
        timer = StageTimer(self.device)
        T = inputs.input_ids.shape[1]
        history = inputs.input_ids
        finished = torch.zeros(history.shape[0], dtype=torch.bool, device=self.device)
        generated, decode_steps = [], 0
        try:
            recorder.phase = "prefill"
            pre = self.prefill(inputs, logits=logits, upto=T if first_token == "prefill" else T - 1, timer=timer)
            cache = pre.cache
            recorder.phase = "decode"

            def select(logits: torch.Tensor) -> torch.Tensor:
                return next_tokens(logits, history, no_repeat_ngram_size, finished, self.spec.pad_token_id)

            # token choice is timed with the step that produced the logits, as in the one-shot path
            if first_token == "prefill":
                with timer.stage("prefill"):
                    token = select(pre.logits[:, -1])
            else:
                with timer.stage("decode", track_memory=True):
                    step_logits, cache = self.decode_step(history[:, -1], cache)
                    token = select(step_logits)
                decode_steps += 1
            del pre  # frees the all-position logits during decode
            for step in range(max_new_tokens):
                generated.append(token)
                history = torch.cat([history, token[:, None]], 1)
                finished |= token == self.spec.eos_token_id
                if bool(finished.all()) or step == max_new_tokens - 1:
                    break
                with timer.stage("decode", track_memory=True):
                    step_logits, cache = self.decode_step(token, cache)
                    token = select(step_logits)
                decode_steps += 1
        finally:
            recorder.close()
        result = self._result("separated", inputs, generated, timer)
        kv_length = int(cache.length)  # read before a reference run can reuse (fast mode) the same buffers
        if reference is None:
            yardstick = self.reference() if hasattr(self, "reference") else self  # always the HF-like path
            reference = yardstick.generate_one_shot(inputs, max_new_tokens, no_repeat_ngram_size, logits)
        prefill_len = T if first_token == "prefill" else T - 1
        peak = timer.peak_memory
        result.verification = {
            "first_token": first_token,
            "tokens_equal_one_shot": result.generated_ids == reference.generated_ids,
            "first_divergence": _first_divergence(result.generated_ids, reference.generated_ids),
            "image_args_in_decode": recorder.image_args.get("decode", 0),
            "vision_calls_in_decode": recorder.vision_calls.get("decode", 0),
            "vision_calls_in_prefill": recorder.vision_calls.get("prefill", 0),
            "decode_steps": decode_steps,
            "kv_length": kv_length,
            "kv_length_expected": prefill_len + decode_steps,
            "kv_length_ok": kv_length == prefill_len + decode_steps,
            "vision_time_in_decode_s": 0.0 if recorder.vision_calls.get("decode", 0) == 0 else None,
            "prefill_peak_memory": peak.get("prefill"),
            "decode_peak_memory": peak.get("decode"),
            "decode_memory_ok": (peak["decode"] <= max(peak.get(s, 0) for s in (*VISION_STAGES, "prefill"))
                                 if "decode" in peak else None),
        }
        result.verification["passed"] = bool(
            result.verification["tokens_equal_one_shot"] and result.verification["image_args_in_decode"] == 0
            and result.verification["vision_calls_in_decode"] == 0 and result.verification["kv_length_ok"]
            and result.verification["decode_memory_ok"] is not False)
        return result

    def _result(self, path: str, inputs, generated: list[torch.Tensor], timer: StageTimer) -> GenerationResult:
        stages = timer.finish()
        steps = timer.per_item("decode")  # one time per decode step, also where one launch holds several
        totals: dict[str, float] = {}
        for name, seconds in stages:
            totals[name] = totals.get(name, 0.0) + seconds
        ttft = sum(totals.get(s, 0.0) for s in (*VISION_STAGES, "prefill"))
        gen = torch.stack(generated, 1).tolist() if generated else [[] for _ in range(inputs.input_ids.shape[0])]
        rows = [_trim(row, self.spec.eos_token_id) for row in gen]
        texts = [self.tokenizer.decode([t for t in row if t != self.spec.eos_token_id]) for row in rows]
        timings = {**{k: totals.get(k, 0.0) for k in (*VISION_STAGES, "prefill")},
                   "decode": totals.get("decode", 0.0), "decode_steps": steps, "ttft_s": ttft,
                   "tpot_s": median(steps) if steps else None, "total_s": sum(totals.values()),
                   "peak_memory": dict(timer.peak_memory)}
        return GenerationResult(path, inputs.input_ids.tolist(), rows, texts, timings)

    # ------------------------------------------------------------------ FLOPs (separate pass)
    @torch.no_grad()
    def count_stage_flops(self, inputs, logits: str = "all", decode_steps: int = 1) -> dict:
        """FLOPs of sam, clip, projector, prefill and `decode_steps` decode steps, each counted by
        FlopCounterMode in its own pass (never while timing). Returns {stage: {"flops", "modules"}}."""
        m = self.model.model
        out: dict[str, dict] = {}
        counters: dict[str, list] = {}

        def stage(name: str):
            # a fresh counter per entry: a FlopCounterMode clears its counts when entered again
            counters.setdefault(name, []).append(model_counter(self.model))
            return counters[name][-1]

        with torch.no_grad():
            embeds = m.vision_embeddings(inputs.images, inputs.images_spatial_crop, stage=stage)
        for name in VISION_STAGES:
            total, mods = module_flops(counters[name], self.model)
            out[name] = {"flops": total, "modules": mods}
        x = m.embed(inputs.input_ids, inputs.images_seq_mask, embeds)
        (logits_out, cache), total, mods = count_flops(lambda: self.model.forward_lm(x, cache=None, logits=logits),
                                                       self.model)
        out["prefill"] = {"flops": total, "modules": mods}
        token = logits_out[:, -1].argmax(-1)
        step_flops, step_mods = [], {}
        for _ in range(decode_steps):
            (step_logits, cache), total, mods = count_flops(lambda: Session.decode_step(self, token, cache),
                                                            self.model)
            token = step_logits.argmax(-1)
            step_flops.append(total)
            for k, v in mods.items():
                step_mods[k] = step_mods.get(k, 0) + v
        out["decode"] = {"flops": sum(step_flops), "per_step": step_flops, "modules": step_mods}
        return out


def _trim(row: list[int], eos: int) -> list[int]:
    return row[: row.index(eos) + 1] if eos in row else row


def _first_divergence(a: list[list[int]], b: list[list[int]]) -> dict | None:
    """First (row, position) where two id lists differ, or None when equal."""
    for r, (x, y) in enumerate(zip(a, b)):
        for i, (p, q) in enumerate(zip(x, y)):
            if p != q:
                return {"row": r, "index": i, "a": p, "b": q}
        if len(x) != len(y):
            n = min(len(x), len(y))
            return {"row": r, "index": n, "a": x[n] if n < len(x) else None, "b": y[n] if n < len(y) else None}
    if len(a) != len(b):
        return {"row": min(len(a), len(b)), "index": 0, "a": None, "b": None}
    return None

