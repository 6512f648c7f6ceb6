"""Greedy token selection with the vendor's logits processing, shared by every generation path.

Both the one-shot and the separated path call `next_tokens`, so they cannot drift apart in how a token is chosen.
"""
from __future__ import annotations

import torch


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
