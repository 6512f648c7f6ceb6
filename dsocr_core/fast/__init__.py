"""Fast session mode: DeepSeek-OCR prefill and decode near the hardware limits, on the reference model's weights
(static KV cache, CUDA graphs, torch.compile'd decode pieces, grouped experts without host sync, flash attention
in SAM via a folded relative-position bias, last-position logits). See docs/fast-mode.md."""
from .engine import FastCache, FastEngine, StaleCacheError
from .session import SESSION_MODES, FastSession, load_session

__all__ = ["FastCache", "FastEngine", "FastSession", "SESSION_MODES", "StaleCacheError", "load_session"]
