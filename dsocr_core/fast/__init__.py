"""Fast session mode: DeepSeek-OCR prefill and decode near the hardware limits, on the reference model's weights
(static KV cache, CUDA graphs, torch.compile'd decode pieces, grouped experts without host sync, flash attention
in SAM via a folded relative-position bias, last-position logits). A Session in mode "fast" runs this engine
behind the same interface as the reference one (runtime/engine.py). See docs/fast-mode.md."""
from .engine import FastEngine
from .state import FastCache, StaleCacheError

__all__ = ["FastCache", "FastEngine", "StaleCacheError"]
