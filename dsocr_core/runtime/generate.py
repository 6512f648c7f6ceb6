"""The one greedy generator, and everything about choosing, trimming and comparing tokens.

`Greedy` is the only decoding loop in the package: one-shot and separated generation, measured sweeps, dataset
runs and parity all iterate it. Its first yield is the first new token, chosen from the prefill's logits, so a
caller that stops there has timed the time to first token. Each later yield is one decode step's token.

Token choice is `next_tokens` (greedy, with the vendor's n-gram ban); engines run it inside `Engine.greedy`, on
the host after each step or fused into the step's kernels, and must choose exactly what it chooses.
"""
from __future__ import annotations

from typing import Iterator, Literal

import torch

from .timing import StageTimer, synchronize

FirstToken = Literal["prefill", "redecode"]
MemoryTracking = Literal["step", "loop", "none"]


def ban_repeated_ngrams(history: torch.Tensor, scores: torch.Tensor, n: int) -> torch.Tensor:
    """HF `no_repeat_ngram_size` semantics: forbid any token that would complete an n-gram already present in
    `history` (prompt and generated tokens, [B, L]). Vectorised, so it runs on the GPU without a host sync."""
    if n <= 0 or history.shape[1] < n:
        return scores
    # the last n-1 tokens; every earlier window whose first n-1 tokens equal them bans its n-th token
    prefix = history[:, history.shape[1] - n + 1:]
    windows = history.unfold(1, n, 1)  # [B, L-n+1, n]
    hits = (windows[..., :-1] == prefix.unsqueeze(1)).all(-1)  # [B, L-n+1]
    vocab = scores.shape[-1]
    # windows that do not match point at a spare column past the vocabulary, dropped below
    target = torch.where(hits, windows[..., -1].clamp(max=vocab), torch.full_like(windows[..., -1], vocab))
    banned = torch.zeros(scores.shape[0], vocab + 1, dtype=torch.bool, device=scores.device)
    banned.scatter_(1, target, True)
    return scores.masked_fill(banned[:, :vocab], float("-inf"))


def next_tokens(logits: torch.Tensor, history: torch.Tensor, no_repeat_ngram_size: int,
                finished: torch.Tensor, pad_token_id: int) -> torch.Tensor:
    """Greedy choice for one step. logits [B, V] (float32), history [B, L]; finished rows emit the pad id."""
    scores = ban_repeated_ngrams(history, logits, no_repeat_ngram_size)
    chosen = scores.argmax(-1)
    return torch.where(finished, torch.full_like(chosen, pad_token_id), chosen)


class Greedy:
    """Greedy generation through any engine: iterate it for one [B] token tensor per step.

    `first_token` "prefill": the first token comes from the prefill's last-position logits (what `generate()`
    does); "redecode": the prefill stops one prompt token short and that token is fed as the first decode step.
    `stop_at_eos` False runs all `max_new_tokens` steps whatever is chosen (measurement). Timing: the prefill's
    stages are timed by the engine; the first token's choice is timed as `prefill`, every engine call after it as
    one `decode` entry holding the steps it ran. `memory`: peak memory per decode entry ("step", a host sync
    each), over the whole decode loop ("loop", one reset before and one read after) or not at all.

    After the loop: `cache` (the engine's cache), `prompt_length` (positions the prefill cached) and
    `decode_steps` (engine decode steps run)."""

    def __init__(self, engine, inputs, max_new_tokens: int, no_repeat_ngram_size: int = 20, *,
                 timer: StageTimer | None = None, logits: str = "last", first_token: FirstToken = "prefill",
                 stop_at_eos: bool = True, memory: MemoryTracking = "step"):
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        if first_token not in ("prefill", "redecode"):
            raise ValueError(f"first_token must be 'prefill' or 'redecode', got {first_token!r}")
        self.engine = engine
        self.inputs = inputs
        self.max_new_tokens = max_new_tokens
        self.ngram = no_repeat_ngram_size
        self.timer = timer or StageTimer(engine.device)
        self.logits = logits
        self.first_token = first_token
        self.stop_at_eos = stop_at_eos
        self.memory = memory
        self.cache = None
        self.prompt_length = 0
        self.decode_steps = 0

    def __iter__(self) -> Iterator[torch.Tensor]:
        spec, timer, engine = self.engine.spec, self.timer, self.engine
        ids = self.inputs.input_ids
        b, t = ids.shape
        upto = t if self.first_token == "prefill" else t - 1
        logits, cache = engine.prefill(self.inputs, logits=self.logits, upto=upto, timer=timer,
                                       room=self.max_new_tokens)
        self.cache, self.prompt_length = cache, upto
        finished = torch.zeros(b, dtype=torch.bool, device=ids.device)
        step_memory = self.memory == "step"
        if self.first_token == "prefill":
            with timer.stage("prefill"):
                token = next_tokens(logits[:, -1], cache.history[:, :t], self.ngram, finished, spec.pad_token_id)
            del logits  # the prefill's (possibly all-position) logits are not needed while decoding
            cache.history[:, t].copy_(token)
        else:
            del logits
            with timer.stage("decode", track_memory=step_memory):
                token = engine.greedy(cache, ids[:, -1], 1, self.ngram, finished)[:, 0]
            self.decode_steps += 1
        if self.memory == "loop" and timer.cuda:
            synchronize(engine.device)
            torch.cuda.reset_peak_memory_stats(engine.device)
        produced, interval = 1, engine.eos_check_interval
        pending = [token]
        try:
            while pending:
                for token in pending:
                    yield token
                pending = []
                if produced >= self.max_new_tokens:
                    break
                if self.stop_at_eos and produced % interval == 0 and self._all_finished(cache, t, produced):
                    break
                with timer.stage("decode", track_memory=step_memory) as entry:
                    chunk = engine.greedy(cache, token, self.max_new_tokens - produced, self.ngram, finished)
                    entry.count = chunk.shape[1]
                self.decode_steps += chunk.shape[1]
                produced += chunk.shape[1]
                pending = list(chunk.unbind(1))
        finally:
            if self.memory == "loop" and timer.cuda and self.decode_steps:
                synchronize(engine.device)
                timer.peak_memory["decode"] = int(torch.cuda.max_memory_allocated(engine.device))

    def _all_finished(self, cache, t: int, produced: int) -> bool:
        """Every row has emitted EOS among its new tokens (read from the cache's token history: one host sync)."""
        new = self.cache.history[:, t:t + produced]
        return bool((new == self.engine.spec.eos_token_id).any(1).all())

    def run(self) -> list[torch.Tensor]:
        """Every token, as a list of [B] tensors, cut after the step where the last row emitted EOS."""
        tokens = list(self)
        return cut_after_all_finished(tokens, self.engine.spec.eos_token_id) if self.stop_at_eos else tokens


def cut_after_all_finished(generated: list[torch.Tensor], eos: int) -> list[torch.Tensor]:
    """Drop the steps after the one where the last row emitted EOS (an engine that checks for EOS only every
    few steps runs a few more)."""
    if not generated:
        return generated
    hit = torch.stack(generated, 1) == eos  # [B, n]
    if not bool(hit.any(1).all()):
        return generated
    last = int(hit.float().argmax(1).max())  # step where the slowest row finished
    return generated[: last + 1]
