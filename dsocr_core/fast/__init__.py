"""Fast session mode: DeepSeek-OCR prefill and decode near the hardware limits, on the reference model's weights
(static KV cache, CUDA graphs, torch.compile'd decode pieces, grouped experts without host sync, flash attention
in SAM via a folded relative-position bias, last-position logits). A Session in mode "fast" runs this engine
behind the same interface as the reference one (runtime/engine.py). See docs/fast-mode.md.

The engine is imported on first use: `fast.options` and `fast.plan` (its options and kernel plan) are torch-free,
so the time model and the dashboard's sidebar can read them without loading torch."""

__all__ = ["FastCache", "FastEngine", "StaleCacheError"]


def __getattr__(name):
    if name == "FastEngine":
        from .engine import FastEngine

        return FastEngine
    if name in ("FastCache", "StaleCacheError"):
        from . import state

        return getattr(state, name)
    raise AttributeError(name)
