"""A decoded page image of any Pillow mode -> RGB, with high-bit-depth images reduced faithfully.

Pillow's `convert("RGB")` clips the samples of 16-bit, 32-bit integer and float images to 0..255, so a 16-bit
grayscale scan (mode I;16) becomes 99.6% white: the model sees a blank page. Those modes are reduced to 8 bits
here first (16-bit: the top 8 bits of each sample, as libpng's strip-16 does); every other mode (1, L, P, LA, RGB,
RGBA, CMYK, ...) is converted by Pillow exactly as the vendor's pipeline converts it. Torch-free.
"""
from __future__ import annotations

import numpy as np
from PIL import Image

SIXTEEN_BIT_MODES = frozenset({"I;16", "I;16L", "I;16B", "I;16N"})
HIGH_BIT_MODES = SIXTEEN_BIT_MODES | {"I", "F"}


def to_rgb(image: Image.Image) -> Image.Image:
    """The image as RGB (a loaded Pillow image in, a new or the same image out)."""
    if image.mode in HIGH_BIT_MODES:
        image = Image.fromarray(to_8_bit(np.asarray(image), image.mode), "L")
    return image if image.mode == "RGB" else image.convert("RGB")


def to_8_bit(samples: np.ndarray, mode: str) -> np.ndarray:
    """One channel of high-bit-depth samples as uint8. 16-bit modes: the top byte. Mode I (32-bit integers, also
    what older Pillow made of 16-bit PNGs): the top byte when it fits 0..65535, else its own range stretched to
    0..255. Mode F: x 255 when it lies in [0, 1], else its own range (non-finite samples count as 0)."""
    if mode in SIXTEEN_BIT_MODES or (mode == "I" and samples.size and 0 <= samples.min() and samples.max() <= 65535):
        return (samples.astype(np.uint16, copy=False) >> 8).astype(np.uint8)
    samples = samples.astype(np.float32) if mode == "I" else np.nan_to_num(samples, nan=0.0, posinf=0.0, neginf=0.0)
    low, high = (float(samples.min()), float(samples.max())) if samples.size else (0.0, 1.0)
    if mode == "F" and 0.0 <= low and high <= 1.0:
        low, high = 0.0, 1.0
    scale = 255.0 / (high - low) if high > low else 0.0
    return np.clip(np.rint((samples - low) * scale), 0, 255).astype(np.uint8)
