"""Grounding output (`<|ref|>LABEL<|/ref|><|det|>[[x1, y1, x2, y2], ...]<|/det|>` blocks with 0..999 coordinates
relative to the original page): parse.py reads it, render.py draws it and cleans it to markdown, compare.py compares
outputs; data flows parse <- render <- compare. samples.py draws the project's own sample pages.

Note: after this import the package attribute `parse` is the function `parse.parse`, not the module; import the
module's other names with `from dsocr_core.grounding.parse import ...`.
"""
from .parse import PAGE_SPLIT, Block, ParseResult, Problem, iou, normalize_box, parse, to_pixels
from .render import ResultAssets, block_colour, build_result, crop_images, render, save_result, to_markdown
from .compare import (DetectionComparison, Divergence, PairComparison, compare_outputs, compare_pair,
                      first_divergence, match_blocks)

__all__ = [
    "PAGE_SPLIT", "Block", "ParseResult", "Problem", "iou", "normalize_box", "parse", "to_pixels",
    "ResultAssets", "block_colour", "build_result", "crop_images", "render", "save_result", "to_markdown",
    "DetectionComparison", "Divergence", "PairComparison", "compare_outputs", "compare_pair", "first_divergence",
    "match_blocks",
]
