"""Token parity between the reference and the fast path, with the evidence needed when they differ.

`greedy_trace` runs one greedy generation through any session's prefill and decode_step and keeps, per step, the
chosen token and the gap between the best and second-best score after the n-gram ban (the logit margin).
`compare` runs it for both sessions and reports the first divergence with both margins: a divergence at a step
whose margin is at the bf16 rounding level is a rounding flip, not a bug.
"""
from __future__ import annotations

import torch

from ..runtime.generate import ban_repeated_ngrams, next_tokens
from ..runtime.tokens import first_difference

# the largest logit difference two correct bf16 paths show, relative to the largest logit: bf16 keeps 8 significant
# bits (one unit in the last place is 2^-7 of the leading power of two); paths that accumulate in another order
# differ by a few units (0.04-0.055 at logits of 3.4-3.5 on an H200), so 2^-4 leaves a margin of about 4x
ROUNDING_LEVEL = 2 ** -4


@torch.no_grad()
def greedy_trace(session, inputs, steps: int, no_repeat_ngram_size: int = 20, logits: str = "last",
                 force: torch.Tensor | None = None) -> dict:
    """Tokens [B, steps] and top-1 minus top-2 margins [B, steps] (after the ban) of greedy decoding.
    With `force` [B, steps] (teacher forcing) the forced tokens are fed back instead of the chosen ones;
    `tokens` still holds this session's own choice at every step."""
    b, t = inputs.input_ids.shape
    pre = session.prefill(inputs, logits=logits, room=steps)
    cache, step_logits = pre.cache, pre.logits[:, -1]
    history = inputs.input_ids
    finished = torch.zeros(b, dtype=torch.bool, device=history.device)
    pad = session.spec.pad_token_id
    tokens, margins, logits_kept = [], [], []
    for step in range(steps):
        scores = ban_repeated_ngrams(history, step_logits, no_repeat_ngram_size)
        top2 = torch.topk(scores, 2, dim=-1).values
        margins.append((top2[:, 0] - top2[:, 1]).float())
        logits_kept.append(step_logits.float().cpu())
        token = next_tokens(step_logits, history, no_repeat_ngram_size, finished, pad)
        tokens.append(token)
        if force is not None:
            token = force[:, step].to(token.device)
        history = torch.cat([history, token[:, None]], 1)
        if step + 1 < steps:
            step_logits = session.decode_step(token, cache)
    return {"tokens": torch.stack(tokens, 1).cpu(), "margins": torch.stack(margins, 1).cpu(),
            "logits": logits_kept}


def compare(reference, fast, inputs, steps: int, no_repeat_ngram_size: int = 20, teacher_forced: bool = True,
            tie_margin: float = 0.0) -> dict:
    """Greedy tokens of both sessions over `steps` steps; equality, first divergence, margins there, and the
    largest logit difference over the steps before it. With teacher_forced, the fast session is run again on
    the reference's tokens (identical histories, so logits compare directly), and every step where its choice
    differs is listed with the reference's top-1/top-2 margin and that step's largest logit difference: a path
    that differs only by rounding disagrees only where the margin is within twice that difference."""
    ref = greedy_trace(reference, inputs, steps, no_repeat_ngram_size)
    fst = greedy_trace(fast, inputs, steps, no_repeat_ngram_size)
    equal = torch.equal(ref["tokens"], fst["tokens"])
    out = {"steps": steps, "batch": int(inputs.input_ids.shape[0]), "tokens_equal": equal,
           "first_divergence": None,
           "min_margin_reference": float(ref["margins"].min()),
           "reference_tokens": ref["tokens"].tolist(), "fast_tokens": fst["tokens"].tolist()}
    upto = steps
    if not equal:
        # the earliest step at which any row parts (rows part independently; later steps follow from it)
        parts = [(i, r) for r, (x, y) in enumerate(zip(out["reference_tokens"], out["fast_tokens"]))
                 if (i := first_difference(x, y)) is not None]
        first, row = min(parts)
        upto = first
        out["first_divergence"] = {
            "row": row, "step": first, "reference_token": int(ref["tokens"][row, first]),
            "fast_token": int(fst["tokens"][row, first]),
            "reference_margin": float(ref["margins"][row, first]), "fast_margin": float(fst["margins"][row, first]),
        }
    # logits agree while the histories agree: the largest difference up to (and including) the divergence
    n = min(upto + 1, steps)
    deltas = [float((a - b).abs().max()) for a, b in zip(ref["logits"][:n], fst["logits"][:n])]
    scale = [float(a.abs().max()) for a in ref["logits"][:n]]
    out["max_logit_abs_diff"] = max(deltas) if deltas else 0.0
    out["max_logit_abs"] = max(scale) if scale else 0.0
    if teacher_forced:
        forced = greedy_trace(fast, inputs, steps, no_repeat_ngram_size, force=ref["tokens"])
        miss = (forced["tokens"] != ref["tokens"])
        step_delta = [(a - b).abs().amax(-1) for a, b in zip(ref["logits"], forced["logits"])]  # [B] per step
        rows = []
        for r, c in miss.nonzero().tolist():
            m, d = float(ref["margins"][r, c]), float(step_delta[c][r])
            scale = float(ref["logits"][c][r].abs().max())
            # both leading scores can move by up to d, so a margin within 2d is a flip; it is a rounding flip
            # only while d itself is at rounding level (a real difference moves the logits by far more)
            rows.append({"row": r, "step": c, "reference_margin": m, "logit_abs_diff": d,
                         "rounding_flip": m <= max(2 * d, tie_margin) and d <= ROUNDING_LEVEL * max(scale, 1.0)})
        out["teacher_forced"] = {
            "agree": int((~miss).sum()), "total": int(miss.numel()), "disagreements": rows,
            "all_rounding_flips": all(row["rounding_flip"] for row in rows),
            "max_logit_abs_diff": max(float(d.max()) for d in step_delta),
            "median_logit_abs_diff": float(torch.stack(step_delta).median()),
        }
    return out
