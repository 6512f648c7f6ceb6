"""The engine interface shared by the reference and the fast path, and the reference engines.

An engine runs the model's work; a Session holds one and never asks which. Every engine has:

    spec, device, mode                        the model spec, its device, "reference" | "fast"
    eos_check_interval                        how often (in tokens) the generator may sync to look for EOS
    prefill(inputs, *, logits, upto, timer, room) -> (logits, cache)
        vision + LM over the prompt's first `upto` tokens (all when None); logits float32 [B, T, V] ("all") or
        [B, 1, V] ("last"), valid until the engine's next prefill; `room`: decode steps to make space for
    decode_step(token, cache) -> logits       token [B] at position cache.length, the cache only (no image can
                                              reach a step); float32 [B, V], valid until the next step
    greedy(cache, token, limit, ngram, finished) -> tokens [B, j], 1 <= j <= limit
        decode steps from `token` (the token chosen last, not yet cached), each choosing the next token as
        generate.next_tokens does and writing it to cache.history; `finished` [B] rows emit the pad id
    describe() -> dict

and every cache has `length` (positions cached), `history` ([B, capacity] prompt and chosen token ids),
`bytes_used` (keys and values of the cached positions) and `bytes_allocated` (what the cache holds in memory).
"""
from __future__ import annotations

from typing import Protocol

import torch

from ..engines import SESSION_MODES, EngineSpec, as_engine
from ..model.kv_cache import KVCache
from .generate import next_tokens
from .timing import StageTimer

__all__ = ["Engine", "OneShotEngine", "ReferenceCache", "ReferenceEngine", "SESSION_MODES", "build_engine",
           "history_buffer"]


class Engine(Protocol):
    spec: object
    device: torch.device
    mode: str
    eos_check_interval: int
    state_epoch: int  # changes when the engine dropped what a warm-up prepared (see FastEngine.state_epoch)

    def prefill(self, inputs, *, logits: str = "last", upto: int | None = None, timer: StageTimer | None = None,
                room: int = 0) -> tuple[torch.Tensor, object]: ...

    def decode_step(self, token: torch.Tensor, cache) -> torch.Tensor: ...

    def greedy(self, cache, token: torch.Tensor, limit: int, ngram: int, finished: torch.Tensor) -> torch.Tensor: ...

    def describe(self) -> dict: ...

    def release(self, batch: int | None = None) -> None: ...

    def point_state(self, batch: int) -> dict: ...


def history_buffer(input_ids: torch.Tensor, room: int) -> torch.Tensor:
    """[B, T + room + 1] token ids, the prompt written in."""
    b, t = input_ids.shape
    history = torch.zeros(b, t + max(room, 0) + 1, dtype=torch.long, device=input_ids.device)
    history[:, :t].copy_(input_ids)
    return history


class ReferenceCache(KVCache):
    """The model's own dynamic cache plus the rows' token history."""

    def __init__(self, history: torch.Tensor, inputs=None):
        super().__init__()
        self.history = history
        self.inputs = inputs  # the one-shot engine passes the image arguments with every step


class ReferenceEngine:
    """Our PyTorch model as written (eager / SDPA kernels, the MoE's expert loop): the separated path, with the
    vision stages (sam, clip, projector) and the LM prefill timed one by one."""

    mode = "reference"
    eos_check_interval = 1  # the reference loop looks for EOS after every step, like HF generate()
    state_epoch = 0  # nothing is kept between runs

    def __init__(self, model: torch.nn.Module):  # no options (runtime/reference_plan.ReferenceOptions)
        self.model = model.eval()
        self.spec = model.spec
        self.device = model.lm_head.weight.device

    @torch.no_grad()
    def prefill(self, inputs, *, logits: str = "last", upto: int | None = None, timer: StageTimer | None = None,
                room: int = 0) -> tuple[torch.Tensor, ReferenceCache]:
        timer = timer or StageTimer(self.device)
        ids = inputs.input_ids if upto is None else inputs.input_ids[:, :upto]
        mask = inputs.images_seq_mask if upto is None else inputs.images_seq_mask[:, :upto]
        cache = ReferenceCache(history_buffer(inputs.input_ids, room))
        m = self.model.model
        # the model's own vision code (what one-shot generation runs), each stage timed with its peak memory
        embeds = m.vision_embeddings(inputs.images, inputs.images_spatial_crop,
                                     stage=lambda name: timer.stage(name, track_memory=True))
        with timer.stage("prefill", track_memory=True):
            out, _ = self.model.forward_lm(m.embed(ids, mask, embeds), cache=cache, logits=logits)
        return out, cache

    @torch.no_grad()
    def decode_step(self, token: torch.Tensor, cache: ReferenceCache) -> torch.Tensor:
        out, _ = self.model(input_ids=token.view(-1, 1), cache=cache, logits="last")
        return out[:, -1]

    @torch.no_grad()
    def greedy(self, cache, token: torch.Tensor, limit: int, ngram: int, finished: torch.Tensor) -> torch.Tensor:
        """One step per call (the host chooses after every step)."""
        n = cache.length  # position of `token`
        logits = self.decode_step(token, cache)
        chosen = next_tokens(logits, cache.history[:, :n + 1], ngram, finished, self.spec.pad_token_id)
        finished |= chosen == self.spec.eos_token_id
        cache.history[:, n + 1].copy_(chosen)
        return chosen[:, None]

    def describe(self) -> dict:
        return {"session_mode": self.mode, "call_pattern": "separated"}

    def release(self, batch: int | None = None) -> None:
        """Nothing to free: every prefill builds its own cache."""

    def point_state(self, batch: int) -> dict:
        """How a run was executed: eagerly, nothing compiled, captured or kept between runs."""
        return {"engine": self.mode, "call_pattern": self.describe()["call_pattern"], "compiled": "eager",
                "graphs": "none", "kept_between_runs": "nothing"}


class OneShotEngine(ReferenceEngine):
    """HF `generate()`'s call pattern, the parity yardstick: every step is one full model call carrying the image
    arguments; the model runs vision only for a call of more than one token (the prefill), so the prefill is one
    stage and sam / clip / projector are not timed apart."""

    @torch.no_grad()
    def prefill(self, inputs, *, logits: str = "last", upto: int | None = None, timer: StageTimer | None = None,
                room: int = 0) -> tuple[torch.Tensor, ReferenceCache]:
        if upto is not None and upto != inputs.input_ids.shape[1]:
            raise ValueError("the one-shot path prefills the whole prompt (first_token='prefill')")
        timer = timer or StageTimer(self.device)
        cache = ReferenceCache(history_buffer(inputs.input_ids, room), inputs)
        with timer.stage("prefill", track_memory=True):
            out, _ = self.model(input_ids=inputs.input_ids, images=inputs.images,
                                images_seq_mask=inputs.images_seq_mask,
                                images_spatial_crop=inputs.images_spatial_crop, cache=cache, logits=logits)
        return out, cache

    @torch.no_grad()
    def decode_step(self, token: torch.Tensor, cache: ReferenceCache) -> torch.Tensor:
        i = cache.inputs
        out, _ = self.model(input_ids=token.view(-1, 1), images=i.images, images_seq_mask=i.images_seq_mask,
                            images_spatial_crop=i.images_spatial_crop, cache=cache, logits="last")
        return out[:, -1]

    def describe(self) -> dict:
        return {"session_mode": self.mode, "call_pattern": "one-shot"}


def build_engine(engine: "EngineSpec | str", model: torch.nn.Module) -> Engine:
    """The engine an engine description (engines.EngineSpec, or a session mode: its default options) describes,
    over `model`."""
    return as_engine(engine).build(model)


def state_text(state: dict | None) -> str | None:
    """One line of a point's engine state (Engine.point_state) for tables, e.g. 'fast: compiled static (lm 3
    variants), graphs: decode 1/1, prefill graph; cache 4,352 (bucket 256), fused decode'. None without a state."""
    if not state:
        return None
    if state.get("engine") != "fast":
        return f"{state.get('engine')}: eager, nothing kept between runs"
    compiled = state.get("compiled_prefill")
    if isinstance(compiled, dict) and compiled:
        policies = sorted({v["shapes"] for v in compiled.values()})
        variants = ", ".join(f"{n} {v['variants']}" for n, v in compiled.items())
        parts = [f"compiled {'/'.join(policies)} ({variants} variants)"]
    else:
        parts = ["prefill eager"]
    if not state.get("graphs_enabled"):
        parts.append("graphs off")
    elif "decode_graphs" in state:
        decode = state["decode_graphs"].values()
        prefill = sorted(set(state.get("prefill_graphs", {}).values()))
        parts.append(f"graphs: decode {sum(v == 'graph' for v in decode)}/{len(decode)}, prefill "
                     f"{'/'.join(prefill) or 'none'}")
    if "capacity" in state:
        parts.append(f"cache {state['capacity']:,} (bucket {state['bucket']}), {state['decode_path']} decode")
    return "fast: " + ", ".join(parts)
