"""Parity run: one page through the one-shot and the separated path, compared token for token and box for box.

The one-shot path marks its first generation step (the prefill) with its own NVTX range, so Nsight shows both
paths with the same stage names.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..grounding import DetectionComparison, build_result, compare_outputs
from ..registry import LM_STAGES, vision_stage_names
from ..runtime.inputs import load_image
from ..runtime.session import GenerationResult, Session

DEFAULT_PROMPT = "<image>\n<|grounding|>Convert the document to markdown."


@dataclass
class ParityReport:
    image_name: str
    image_size: tuple[int, int]
    mode: str
    prompt: str
    grid: tuple[int, int]
    prompt_tokens: int
    one_shot: GenerationResult
    separated: GenerationResult
    detections: DetectionComparison
    session: dict
    vendor_text: str | None = None
    notes: list[str] = field(default_factory=list)
    # when the tokens part: the separated path teacher-forced on the one-shot tokens (see divergence_evidence)
    evidence: dict | None = None

    @property
    def token_equal(self) -> bool:
        return self.one_shot.generated_ids == self.separated.generated_ids

    @property
    def passed(self) -> bool:
        return bool(self.token_equal and self.separated.verification and self.separated.verification["passed"])

    def timings(self) -> dict:
        """TTFT, TPOT, totals and stage times of both paths."""
        keys = (*vision_stage_names(), *LM_STAGES, "ttft_s", "tpot_s", "total_s")  # the model's own stages kept
        return {r.path: {k: r.timings.get(k) for k in keys if k in r.timings} | {"tokens": len(r.generated_ids[0])}
                for r in (self.one_shot, self.separated)}

    def to_dict(self) -> dict:
        return {
            "image": self.image_name, "image_size": list(self.image_size), "mode": self.mode,
            "prompt": self.prompt, "grid": list(self.grid), "prompt_tokens": self.prompt_tokens,
            "token_equal": self.token_equal, "passed": self.passed,
            "verification": self.separated.verification, "timings": self.timings(),
            "detections": self.detections.to_dict(), "session": self.session,
            "one_shot": {"text": self.one_shot.texts[0], "generated_ids": self.one_shot.generated_ids[0]},
            "separated": {"text": self.separated.texts[0], "generated_ids": self.separated.generated_ids[0]},
            "vendor_text": self.vendor_text, "notes": self.notes, "divergence_evidence": self.evidence,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def renderings(self, image) -> dict:
        """Box renderings, crops and cleaned markdown of each output, for the side-by-side view."""
        texts = {"one-shot": self.one_shot.texts[0], "separated": self.separated.texts[0]}
        if self.vendor_text is not None:
            texts["vendor"] = self.vendor_text
        return {name: build_result(image, text) for name, text in texts.items()}


WARMUP_ROUNDS = 2  # untimed runs of both paths before the timed ones (see run_parity)


def run_parity(session: Session, image, prompt: str = DEFAULT_PROMPT, mode: str | None = None,
               max_new_tokens: int = 512, no_repeat_ngram_size: int = 20, first_token: str = "prefill",
               vendor_text: str | None = None, image_name: str = "page", min_crops: int | None = None,
               max_crops: int | None = None, warmup: bool = True) -> ParityReport:
    """Run both generation paths on one page (under the session's lock) and compare them. Short untimed runs of
    both paths first (WARMUP_ROUNDS of them) keep one-off costs (allocator growth, kernel selection) out of the
    timings: after one round the first timed path still paid about twice its later prefill on a CPU (one-shot
    TTFT 487 ms against 206 and 201 ms on its next runs; separated 306 ms), so the one-shot path, timed first,
    looked twice as slow as the separated one. The mode and crop range default to the session's model's
    (registry)."""
    picture = load_image(image)
    with session.lock:
        inputs = session.prepare(picture, prompt, mode=mode, min_crops=min_crops, max_crops=max_crops)
        for _ in range(WARMUP_ROUNDS if warmup else 0):
            ref = session.generate_one_shot(inputs, 2, no_repeat_ngram_size)
            session.generate_separated(inputs, 2, no_repeat_ngram_size, first_token=first_token, reference=ref)
        one = session.generate_one_shot(inputs, max_new_tokens, no_repeat_ngram_size)
        sep = session.generate_separated(inputs, max_new_tokens, no_repeat_ngram_size, first_token=first_token,
                                         reference=one)
        evidence = None if one.generated_ids == sep.generated_ids else divergence_evidence(
            session, inputs, len(one.generated_ids[0]), no_repeat_ngram_size)
    detections = compare_outputs(one.texts[0], sep.texts[0], vendor_text,
                                 ids_a=one.generated_ids[0], ids_b=sep.generated_ids[0])
    notes = []
    d = session.describe()
    if d.get("synthetic"):
        notes.append("synthetic (random) weights: the text is meaningless; parity of the two paths still holds")
    if d.get("fallback_tokenizer"):
        notes.append("fallback tokenizer: prompt ids differ from the real tokenizer's")
    if d.get("cpu_fallback"):
        notes.append("ran on the CPU")
    if evidence is not None:
        notes.append(evidence["summary"])
    grid = tuple(int(v) for v in inputs.images_spatial_crop[0].tolist())
    return ParityReport(image_name, picture.size, inputs.mode, prompt, grid, inputs.seq_len, one, sep, detections, d,
                        vendor_text, notes, evidence)


def divergence_evidence(session: Session, inputs, steps: int, no_repeat_ngram_size: int = 20) -> dict:
    """Why two paths' tokens part: the session's engine fed the reference model's own greedy tokens (teacher
    forcing, so both see identical histories) and, at every step where its choice differs, the reference's
    top-1 / top-2 margin against the largest logit difference of the two on that history. Every such step within
    rounding (margin <= 2x the difference) means the paths differ only where bf16 cannot tell two tokens apart."""
    from .token_parity import compare

    r = compare(session.with_mode("reference"), session, inputs, steps, no_repeat_ngram_size)
    tf = r["teacher_forced"]
    ties = tf["all_rounding_flips"]
    summary = (f"teacher-forced on the reference's tokens, the {session.session_mode} path agrees at "
               f"{tf['agree']} of {tf['total']} steps; "
               + ("every disagreement is a rounding tie (the two best scores within the paths' logit difference)"
                  if ties else "some disagreement is NOT a rounding tie: a real difference between the paths"))
    return {"teacher_forced": tf, "first_divergence": r["first_divergence"], "all_rounding_ties": ties,
            "summary": summary}
