"""Reading what users type or upload: number lists, WxH pairs, page images, vendor output texts.

Every function raises InputError with a message meant for the page (shown with st.error); nothing here
computes a cost.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

# the one wording of a refused page (the pixel limit above all), shared with the dataset-run uploads
from dsocr_core.measure.uploads import page_problem as _page_problem, pixel_limit_message  # noqa: F401

MAX_LIST = 200  # values per typed list: the analytic sweep is cheap, the charts are not
TEXT_SUFFIXES = (".mmd", ".md", ".txt")
PROMPTS = {  # the vendor's prompts a page offers ('custom' besides)
    "grounding": "<image>\n<|grounding|>Convert the document to markdown.",
    "free OCR": "<image>\nFree OCR.",
    "figure": "<image>\nParse the figure.",
}


class InputError(ValueError):
    """Something typed or uploaded that cannot be used; the message says what and why."""


def int_list(text: str, what: str, low: int = 0, high: int | None = None) -> list[int]:
    """'10, 100, 1000' -> [10, 100, 1000] (sorted, duplicates dropped)."""
    parts = [p for p in re.split(r"[,\s;]+", text.strip()) if p]
    if not parts:
        raise InputError(f"{what}: enter at least one whole number (e.g. 10, 100, 1000)")
    values = []
    for p in parts:
        try:
            v = int(p.replace("_", ""))
        except ValueError:
            raise InputError(f"{what}: {p!r} is not a whole number") from None
        if v < low or (high is not None and v > high):
            bound = f"{low}..{high}" if high is not None else f">= {low}"
            raise InputError(f"{what}: {v} is out of range ({bound})")
        values.append(v)
    values = sorted(set(values))
    if len(values) > MAX_LIST:
        raise InputError(f"{what}: {len(values)} values; at most {MAX_LIST} per list")
    return values


def pair_list(text: str, what: str, low: int = 1, high: int | None = None) -> list[tuple[int, int]]:
    """'640x832, 1240x1754' -> [(640, 832), (1240, 1754)] (order kept, duplicates dropped)."""
    parts = [p for p in re.split(r"[,;\s]+", text.strip()) if p]
    if not parts:
        raise InputError(f"{what}: enter at least one WIDTHxHEIGHT pair (e.g. 640x832)")
    out: list[tuple[int, int]] = []
    for p in parts:
        m = re.fullmatch(r"(\d+)\s*[x×X*]\s*(\d+)", p)
        if not m:
            raise InputError(f"{what}: {p!r} is not WIDTHxHEIGHT (e.g. 640x832)")
        w, h = int(m.group(1)), int(m.group(2))
        for v in (w, h):
            if v < low or (high is not None and v > high):
                bound = f"{low}..{high}" if high is not None else f">= {low}"
                raise InputError(f"{what}: {p} is out of range (each side {bound})")
        if (w, h) not in out:
            out.append((w, h))
    if len(out) > MAX_LIST:
        raise InputError(f"{what}: {len(out)} values; at most {MAX_LIST} per list")
    return out


@dataclass
class Page:
    """One page image to run: its name (file stem), the decoded RGB image and where it came from."""

    name: str
    image: Image.Image
    source: str  # "upload" | "sample"
    path: Path | None = None


def read_page(name: str, data: bytes) -> Page:
    """Decode an uploaded page (corrupt, empty, non-image and oversized files raise InputError)."""
    from dsocr_core.runtime.inputs import ImageError, load_image  # torch: only pages that read images load it

    try:
        image = load_image(data)
    except ImageError as exc:
        raise InputError(f"{name}: {_page_problem(str(exc))}") from None
    return Page(Path(name).stem or "page", image, "upload")


def read_sample(path: Path) -> Page:
    from dsocr_core.runtime.inputs import ImageError, load_image

    try:
        return Page(path.stem, load_image(path), "sample", path)
    except ImageError as exc:
        raise InputError(f"{path.name}: {_page_problem(str(exc))}") from None


def read_text(name: str, data: bytes) -> str:
    """A vendor output text (.mmd/.md/.txt) as UTF-8."""
    if not data:
        raise InputError(f"{name}: the file is empty")
    if b"\x00" in data[:4096]:
        raise InputError(f"{name}: this is a binary file, not a text output (.mmd, .md or .txt in UTF-8)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"{name}: not UTF-8 text (byte {exc.start} cannot be decoded); save the vendor output "
                         "as UTF-8") from None

