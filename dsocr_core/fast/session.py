"""`FastSession`: the reference Session's API (prepare, prefill, decode_step, decode, generate_one_shot,
generate_separated, count_stage_flops, describe) over the fast engine, on the same model object.

Build one with `FastSession.load(...)` (the same arguments as `Session.load`, plus `engine_options`), with
`FastSession.from_session(session)` (shares the reference session's model and tokenizer), or through
`load_session(..., session_mode="fast")`. `describe()["session_mode"]` is "fast"; `reference()` gives a plain
Session over the same weights, for parity runs.

Differences from the reference Session, all deliberate:
* prefill computes logits for the last position by default (`logits="last"`); "all" is still available;
* generate_one_shot runs the engine's generation loop (prefill, then graph-replayed decode steps) and reports
  path "fast": the engine never passes images to decode steps, so the HF one-shot call pattern does not apply;
* decode steps are not individually synchronised; per-step times come from CUDA events read at the end;
* count_stage_flops counts the reference model's FLOPs (the same function; the fast kernels' extra work, e.g.
  the padded SAM head dim, is not model work and is not counted).
"""
from __future__ import annotations

import torch

from ..runtime.session import GenerationResult, PrefillResult, Session
from ..runtime.timing import StageTimer
from .engine import FastCache, FastEngine

SESSION_MODES = ("reference", "fast")


class FastSession(Session):
    session_mode = "fast"

    def __init__(self, model, spec, tokenizer, device, dtype, weights, attn_impl: str = "sdpa",
                 engine_options: dict | None = None):
        super().__init__(model, spec, tokenizer, device, dtype, weights, attn_impl)
        self.engine_options = dict(engine_options or {})
        self._engine: FastEngine | None = None

    @classmethod
    def load(cls, *args, engine_options: dict | None = None, **kwargs) -> "FastSession":
        session = super().load(*args, **kwargs)
        session.engine_options = dict(engine_options or {})
        return session

    @classmethod
    def from_session(cls, session: Session, **engine_options) -> "FastSession":
        """A fast session over a reference session's model and tokenizer (no copy of the model)."""
        return cls(session.model, session.spec, session.tokenizer, session.device, session.dtype,
                   dict(session.weights), session.attn_impl, engine_options)

    @property
    def engine(self) -> FastEngine:
        if self._engine is None:
            self._engine = FastEngine(self.model, **self.engine_options)
        return self._engine

    def reference(self) -> Session:
        """A reference-mode Session over the same model object."""
        return Session(self.model, self.spec, self.tokenizer, self.device, self.dtype, dict(self.weights),
                       self.attn_impl)

    def describe(self) -> dict:
        out = super().describe()
        out["session_mode"] = "fast"
        out["engine"] = self.engine.describe() if self._engine is not None else {"options": self.engine_options}
        return out

    # ------------------------------------------------------------------ stages
    @torch.no_grad()
    def prefill(self, inputs, logits: str = "last", upto: int | None = None, timer: StageTimer | None = None,
                max_new_tokens: int | None = None) -> PrefillResult:
        timer = timer or StageTimer(self.device)
        out, cache = self.engine.prefill(inputs, upto=upto, logits=logits, max_new_tokens=max_new_tokens,
                                         timer=timer)
        times = timer.totals()
        return PrefillResult(out.clone(), cache, cache.length,
                             {k: times.get(k, 0.0) for k in ("sam", "clip", "projector", "prefill")},
                             dict(timer.peak_memory))

    @torch.no_grad()
    def decode_step(self, token: torch.Tensor, cache: FastCache) -> tuple[torch.Tensor, FastCache]:
        """One decode step: token [B] and the cache only. Returns a copy of the logits [B, V] (float32)."""
        return self.engine.decode_step(cache, token).clone(), cache

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate_one_shot(self, inputs, max_new_tokens: int = 8192, no_repeat_ngram_size: int = 20,
                          logits: str = "last") -> GenerationResult:
        """The engine's generation loop; the same token choice (generation.next_tokens) as the reference."""
        timer = StageTimer(self.device)
        generated = self.engine.generate(inputs, max_new_tokens, no_repeat_ngram_size, timer=timer)
        result = self._result("fast", inputs, generated, timer)
        result.timings["vision_calls"] = {}
        return result

    def generate_fast(self, inputs, max_new_tokens: int = 8192, no_repeat_ngram_size: int = 20) -> GenerationResult:
        return self.generate_one_shot(inputs, max_new_tokens, no_repeat_ngram_size)


def load_session(*args, session_mode: str = "reference", engine_options: dict | None = None, **kwargs) -> Session:
    """`Session.load` with a mode switch: 'reference' (HF-like semantics) or 'fast' (this package)."""
    if session_mode == "reference":
        return Session.load(*args, **kwargs)
    if session_mode == "fast":
        return FastSession.load(*args, engine_options=engine_options, **kwargs)
    raise ValueError(f"session_mode must be one of {SESSION_MODES}, got {session_mode!r}")
