"""Parity run: one page through the one-shot and the separated path, compared token for token and box for box.

The one-shot path marks its first generation step (the prefill) with its own NVTX range, so Nsight shows both
paths with the same stage names.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..grounding import DetectionComparison, build_result, compare_outputs
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

    @property
    def token_equal(self) -> bool:
        return self.one_shot.generated_ids == self.separated.generated_ids

    @property
    def passed(self) -> bool:
        return bool(self.token_equal and self.separated.verification and self.separated.verification["passed"])

    def timings(self) -> dict:
        """TTFT, TPOT, totals and stage times of both paths."""
        keys = ("sam", "clip", "projector", "prefill", "decode", "ttft_s", "tpot_s", "total_s")
        return {r.path: {k: r.timings.get(k) for k in keys} | {"tokens": len(r.generated_ids[0])}
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
            "vendor_text": self.vendor_text, "notes": self.notes,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def renderings(self, image) -> dict:
        """Box renderings, crops and cleaned markdown of each output, for the side-by-side view."""
        texts = {"one-shot": self.one_shot.texts[0], "separated": self.separated.texts[0]}
        if self.vendor_text is not None:
            texts["vendor"] = self.vendor_text
        return {name: build_result(image, text) for name, text in texts.items()}


def run_parity(session: Session, image, prompt: str = DEFAULT_PROMPT, mode: str = "gundam",
               max_new_tokens: int = 512, no_repeat_ngram_size: int = 20, first_token: str = "prefill",
               vendor_text: str | None = None, image_name: str = "page", min_crops: int = 2,
               max_crops: int = 9, warmup: bool = True) -> ParityReport:
    """Run both generation paths on one page (under the session's lock) and compare them. A short untimed
    run of both paths first keeps one-off costs (allocator growth, kernel selection) out of the timings."""
    picture = load_image(image)
    with session.lock:
        inputs = session.prepare(picture, prompt, mode=mode, min_crops=min_crops, max_crops=max_crops)
        if warmup:
            ref = session.generate_one_shot(inputs, 2, no_repeat_ngram_size)
            session.generate_separated(inputs, 2, no_repeat_ngram_size, first_token=first_token, reference=ref)
        one = session.generate_one_shot(inputs, max_new_tokens, no_repeat_ngram_size)
        sep = session.generate_separated(inputs, max_new_tokens, no_repeat_ngram_size, first_token=first_token,
                                         reference=one)
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
    grid = tuple(int(v) for v in inputs.images_spatial_crop[0].tolist())
    return ParityReport(image_name, picture.size, mode, prompt, grid, inputs.seq_len, one, sep, detections, d,
                        vendor_text, notes)
