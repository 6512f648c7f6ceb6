"""What a separated run must show against the one-shot run: the same tokens, no image reaching a decode step,
vision only in the prefill, a KV cache of exactly prompt + decode steps, and decode memory within prefill's."""
from __future__ import annotations

import torch

from ..registry import vision_stage_names
from .tokens import first_divergence

PREFILL_STAGES = (*vision_stage_names(), "prefill")  # the vision stages of every model family, then the LM prefill


class CallRecorder:
    """Counts calls of the vision modules and image arguments reaching the model, attributed to the phase the
    timer is in: `prefill` (the prefill and its vision stages) or `decode`."""

    def __init__(self, model: torch.nn.Module, timer):
        self.timer = timer
        self.vision_calls: dict[str, int] = {}
        self.image_args: dict[str, int] = {}
        m = model.model
        self._handles = [mod.register_forward_pre_hook(self._on_vision) for mod in m.vision_modules()]
        self._handles.append(model.register_forward_pre_hook(self._on_model, with_kwargs=True))

    @property
    def phase(self) -> str:
        stage = self.timer.current
        return "prefill" if stage in PREFILL_STAGES else stage or "idle"

    def _on_vision(self, module, args):
        self.vision_calls[self.phase] = self.vision_calls.get(self.phase, 0) + 1

    def _on_model(self, module, args, kwargs):
        if kwargs.get("images") is not None:
            self.image_args[self.phase] = self.image_args.get(self.phase, 0) + 1

    def close(self) -> None:
        for h in self._handles:
            h.remove()


def verification(separated, one_shot, recorder: CallRecorder, first_token: str, prefill_length: int,
                 decode_steps: int, kv_length: int, peak: dict[str, int]) -> dict:
    """The verification report of a separated GenerationResult against a one-shot one."""
    report = {
        "first_token": first_token,
        "tokens_equal_one_shot": separated.generated_ids == one_shot.generated_ids,
        "first_divergence": first_divergence(separated.generated_ids, one_shot.generated_ids),
        "image_args_in_decode": recorder.image_args.get("decode", 0),
        "vision_calls_in_decode": recorder.vision_calls.get("decode", 0),
        "vision_calls_in_prefill": recorder.vision_calls.get("prefill", 0),
        "decode_steps": decode_steps,
        "kv_length": kv_length,
        "kv_length_expected": prefill_length + decode_steps,
        "kv_length_ok": kv_length == prefill_length + decode_steps,
        "vision_time_in_decode_s": 0.0 if recorder.vision_calls.get("decode", 0) == 0 else None,
        "prefill_peak_memory": peak.get("prefill"),
        "decode_peak_memory": peak.get("decode"),
        "decode_memory_ok": (peak["decode"] <= max(peak.get(s, 0) for s in PREFILL_STAGES)
                             if "decode" in peak else None),
    }
    report["passed"] = bool(report["tokens_equal_one_shot"] and report["image_args_in_decode"] == 0
                            and report["vision_calls_in_decode"] == 0 and report["kv_length_ok"]
                            and report["decode_memory_ok"] is not False)
    return report
