"""Our own PyTorch implementation of DeepSeek-OCR (SAM ViT-B + CLIP-L + linear projector + DeepseekV2 MoE LM),
with parameter names and shapes equal to the official checkpoint, and strict checkpoint loading."""
from .checkpoint import (CheckpointError, expected_shapes, load_model, meta_model, save_checkpoint,
                         synthetic_model, synthetic_state_dict)
from .deepseek_ocr import DeepseekOCRForCausalLM, DeepseekOCRModel
from .flop_formulas import flop_counter
from .kv_cache import KVCache

__all__ = [
    "CheckpointError", "DeepseekOCRForCausalLM", "DeepseekOCRModel", "KVCache", "expected_shapes",
    "flop_counter", "load_model", "meta_model", "save_checkpoint", "synthetic_model",
    "synthetic_state_dict",
]
