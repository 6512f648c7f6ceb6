"""Grounding output: parse, de-normalise, render, clean to markdown, compare (facts section 8).

The model writes blocks like

    <|ref|>title<|/ref|><|det|>[[x1, y1, x2, y2], ...]<|/det|>
    # The title text

with integer coordinates 0..999 relative to the ORIGINAL page (x_px = x / 999 * W). PDF pages are joined with
`<--- Page Split --->`. The parser never raises on model output: whatever it cannot read (unclosed or truncated
tags, bad coordinates, loops cut mid-tag) becomes a Problem next to the blocks it could read.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from PIL import Image, ImageDraw, ImageFont

REF_OPEN, REF_CLOSE, DET_OPEN, DET_CLOSE = "<|ref|>", "<|/ref|>", "<|det|>", "<|/det|>"
PAGE_SPLIT = "<--- Page Split --->"
EOS_TEXTS = ("<｜end▁of▁sentence｜>",)  # the decoded EOS the vendor strips from the end of the output
COORD_MAX = 999
TITLE_LABELS = ("title",)  # outlined 4 px wide; every other label 2 px
MAX_LABEL_CHARS = 64

_TAG_RE = re.compile(r"<\|/?(?:ref|det)\|>")
_PARTIAL_TAG_RE = re.compile(r"<\|/?(?:r(?:e(?:f(?:\|)?)?)?|d(?:e(?:t(?:\|)?)?)?)?\Z")  # "<|", "<|re", "<|/det|" ...
_BOX_RE = re.compile(r"\[([^\[\]]*)\]")
_NUMBER_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")

Box = tuple[int, int, int, int]


# ============================================================================================== data
@dataclass
class Problem:
    """Something in the output the parser could not read as intended."""

    kind: str  # unclosed_ref, unclosed_det, ref_without_det, det_without_ref, stray_tag, truncated_tag, bad_box,
    #            coordinate_range, non_integer, inverted_box, empty_label, long_label, no_boxes, repetition,
    #            parser_error (a bug in this module, reported instead of raised)
    message: str
    page: int = 0
    position: int = 0  # character offset inside the page text
    block: int | None = None  # global block index when the problem belongs to a block

    def __str__(self) -> str:
        return f"page {self.page} char {self.position}: {self.message}"


@dataclass
class Block:
    label: str
    boxes: list[Box]  # normalised 0..999 (x1, y1, x2, y2), x1 <= x2, y1 <= y2
    content: str  # the text after the tags up to the next block, whitespace-trimmed
    page: int
    index: int  # position among all blocks of the output (all pages)
    span: tuple[int, int] = (0, 0)  # the tags' character range inside the page text

    @property
    def bbox(self) -> Box | None:
        """The box enclosing all of this block's boxes."""
        if not self.boxes:
            return None
        return (min(b[0] for b in self.boxes), min(b[1] for b in self.boxes),
                max(b[2] for b in self.boxes), max(b[3] for b in self.boxes))

    def pixel_boxes(self, size: tuple[int, int]) -> list[tuple[float, float, float, float]]:
        return [to_pixels(b, size) for b in self.boxes]

    def to_dict(self) -> dict:
        return {"label": self.label, "boxes": [list(b) for b in self.boxes], "content": self.content,
                "page": self.page, "index": self.index}


@dataclass
class ParseResult:
    blocks: list[Block]
    problems: list[Problem]
    pages: list[str]  # raw text of every page (EOS removed)
    removed: list[list[tuple[int, int]]] = field(default_factory=list, repr=False)  # per page: stray/partial tags

    @property
    def ok(self) -> bool:
        return not self.problems

    def labels(self) -> dict[str, int]:
        return dict(Counter(b.label for b in self.blocks))

    def page_blocks(self, page: int) -> list[Block]:
        return [b for b in self.blocks if b.page == page]

    def to_dict(self) -> dict:
        return {"blocks": [b.to_dict() for b in self.blocks], "problems": [dataclasses.asdict(p) for p in self.problems],
                "pages": len(self.pages), "labels": self.labels()}


# ============================================================================================== parsing
def parse(text: str | None) -> ParseResult:
    """Read every grounding block of a model output. Never raises; see ParseResult.problems."""
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    try:
        return _parse(text)
    except Exception as exc:  # noqa: BLE001 - a parser bug must not take the app down; report it instead
        return ParseResult([], [Problem("parser_error", f"internal parser error: {exc!r}"[:200])],
                           text.split(PAGE_SPLIT), [[] for _ in text.split(PAGE_SPLIT)])


def _parse(text: str) -> ParseResult:
    for eos in EOS_TEXTS:
        text = text.replace(eos, "")
    pages = text.split(PAGE_SPLIT)
    blocks: list[Block] = []
    problems: list[Problem] = []
    removed: list[list[tuple[int, int]]] = []
    for page_no, page in enumerate(pages):
        page_blocks, page_problems, page_removed = _parse_page(page, page_no, len(blocks), last=page_no == len(pages) - 1)
        blocks += page_blocks
        problems += page_problems
        removed.append(page_removed)
    problems += _repetition_problems(blocks, pages)
    return ParseResult(blocks, problems, pages, removed)


def _parse_page(s: str, page: int, first_index: int, last: bool):
    blocks: list[Block] = []
    problems: list[Problem] = []
    removed: list[tuple[int, int]] = []

    def problem(kind: str, message: str, pos: int, block: int | None = None) -> None:
        problems.append(Problem(kind, message, page, pos, block))

    # a tag cut off at the very end of the output (generation stopped or was cut mid-tag)
    end = len(s)
    if last:
        m = _PARTIAL_TAG_RE.search(s)
        if m and m.start() < len(s):
            problem("truncated_tag", f"output ends inside a tag: {m.group()!r}", m.start())
            removed.append((m.start(), len(s)))
            end = m.start()

    pos = 0
    while True:
        m = _TAG_RE.search(s, pos, end)
        if not m:
            break
        tag = m.group()
        index = first_index + len(blocks)
        if tag == REF_OPEN:
            block, pos = _read_block(s, m.start(), end, page, index, problem)
            blocks.append(block)
        elif tag == DET_OPEN:
            problem("det_without_ref", "<|det|> without a preceding <|ref|>label<|/ref|>", m.start(), index)
            boxes, det_end = _read_det(s, m.start(), end, page, index, problem)
            blocks.append(Block("", boxes, "", page, index, (m.start(), det_end)))
            pos = det_end
        else:
            problem("stray_tag", f"{tag} without its opening tag", m.start())
            removed.append((m.start(), m.end()))
            pos = m.end()

    # content: from the end of a block's tags to the start of the next block (stray tags cut out)
    starts = [b.span[0] for b in blocks[1:]] + [end]
    for b, stop in zip(blocks, starts):
        b.content = _cut(s, b.span[1], stop, removed).strip()
    return blocks, problems, removed


def _cut(s: str, start: int, stop: int, removed: list[tuple[int, int]]) -> str:
    out, pos = [], start
    for a, b in sorted(removed):
        if b <= pos or a >= stop:
            continue
        out.append(s[pos:max(a, pos)])
        pos = max(pos, b)
    out.append(s[pos:stop])
    return "".join(out)


def _next_tag(s: str, pos: int, end: int):
    return _TAG_RE.search(s, pos, end)


def _read_block(s: str, start: int, end: int, page: int, index: int, problem) -> tuple[Block, int]:
    """A block starting with <|ref|> at `start`. Returns the block (content filled later) and the position after
    its tags."""
    label_start = start + len(REF_OPEN)
    nxt = _next_tag(s, label_start, end)
    if nxt and nxt.group() == REF_CLOSE:
        label = s[label_start:nxt.start()]
        after_ref = nxt.end()
    else:
        # unclosed: the label runs to the end of the line, the next tag, or the end of the text
        stop = nxt.start() if nxt else end
        newline = s.find("\n", label_start, stop)
        stop = newline if newline >= 0 else stop
        label = s[label_start:stop]
        after_ref = stop
        where = "at the end of the output" if stop == end and not nxt else "before the next tag or line end"
        problem("unclosed_ref", f"<|ref|> not closed {where} (label {label[:30]!r})", start, index)
    label = label.strip()
    if not label:
        problem("empty_label", "a block with an empty label", start, index)
    elif len(label) > MAX_LABEL_CHARS or "\n" in label:
        problem("long_label", f"label of {len(label)} characters cut to {MAX_LABEL_CHARS}", start, index)
        label = label.splitlines()[0][:MAX_LABEL_CHARS] if label.splitlines() else ""

    # <|det|> must follow, possibly after whitespace
    rest = s[after_ref:end]
    stripped = len(rest) - len(rest.lstrip(" \t"))
    if s.startswith(DET_OPEN, after_ref + stripped) and after_ref + stripped < end:
        boxes, det_end = _read_det(s, after_ref + stripped, end, page, index, problem)
        if not boxes:
            problem("no_boxes", f"block {label!r} has no readable box", start, index)
        return Block(label, boxes, "", page, index, (start, det_end)), det_end
    if after_ref >= end:
        problem("ref_without_det", f"output ends after the label {label!r}, before its <|det|>", start, index)
    else:
        problem("ref_without_det", f"<|ref|>{label}<|/ref|> without <|det|> boxes", start, index)
    return Block(label, [], "", page, index, (start, after_ref)), after_ref


def _read_det(s: str, start: int, end: int, page: int, index: int, problem) -> tuple[list[Box], int]:
    """Boxes of the <|det|> at `start`; returns them and the position after </det> (or after the readable part)."""
    body_start = start + len(DET_OPEN)
    nxt = _next_tag(s, body_start, end)
    if nxt and nxt.group() == DET_CLOSE:
        body, det_end = s[body_start:nxt.start()], nxt.end()
    else:
        stop = nxt.start() if nxt else end
        newline = s.find("\n", body_start, stop)
        stop = newline if newline >= 0 else stop
        body, det_end = s[body_start:stop], stop
        where = "at the end of the output" if stop == end and not nxt else "before the next tag or line end"
        problem("unclosed_det", f"<|det|> not closed {where}", start, index)
    return _read_boxes(body, start, index, problem), det_end


def _read_boxes(body: str, pos: int, index: int, problem) -> list[Box]:
    boxes: list[Box] = []
    last_close = 0
    for m in _BOX_RE.finditer(body):
        last_close = m.end()
        parts = [p.strip() for p in m.group(1).split(",")]
        if len(parts) != 4:
            problem("bad_box", f"box [{m.group(1)[:40]}] has {len(parts)} values, not 4", pos, index)
            continue
        bad = [p for p in parts if not _NUMBER_RE.fullmatch(p)]
        if bad:
            problem("bad_box", f"non-numeric coordinate {bad[0][:20]!r} in [{m.group(1)[:40]}]", pos, index)
            continue
        values = []
        for p in parts:
            v = float(p)
            if abs(v) > 1e9:  # absurd (or overflowing) values: clamp before any int conversion
                v = -1.0 if v < 0 else COORD_MAX + 1.0
            if v != int(v):
                problem("non_integer", f"coordinate {p[:16]} is not an integer; rounded", pos, index)
            v = int(round(v))
            if not 0 <= v <= COORD_MAX:
                problem("coordinate_range", f"coordinate {p[:16]} outside 0..{COORD_MAX}; clamped", pos, index)
                v = min(max(v, 0), COORD_MAX)
            values.append(v)
        x1, y1, x2, y2 = values
        if x1 > x2 or y1 > y2:
            problem("inverted_box", f"box {values} has x1 > x2 or y1 > y2; corners swapped", pos, index)
            x1, x2 = sorted((x1, x2))
            y1, y2 = sorted((y1, y2))
        boxes.append((x1, y1, x2, y2))
    tail = body[last_close:]
    if "[" in tail and _NUMBER_RE.search(tail):
        problem("bad_box", f"box cut off: {tail.strip()[:40]!r}", pos, index)
    elif not boxes and not _BOX_RE.search(body) and body.strip():
        problem("bad_box", f"no [x1, y1, x2, y2] in {body.strip()[:40]!r}", pos, index)
    return boxes


def _repetition_problems(blocks: list[Block], pages: list[str]) -> list[Problem]:
    """Loops: the same block three or more times in a row, or a page ending in a short span repeated."""
    out: list[Problem] = []
    run = 1
    for k in range(1, len(blocks) + 1):
        same = k < len(blocks) and _block_key(blocks[k]) == _block_key(blocks[k - 1]) \
            and blocks[k].page == blocks[k - 1].page
        if same:
            run += 1
            continue
        if run >= 3:
            first = blocks[k - run]
            out.append(Problem("repetition", f"block {first.label!r} {list(first.boxes)} repeated {run} times in a row "
                                             "(generation loop)", first.page, first.span[0], first.index))
        run = 1
    for page_no, page in enumerate(pages):
        period = _tail_period(page)
        if period:
            p, times = period
            out.append(Problem("repetition", f"page ends with a {p}-character span repeated {times} times "
                                             "(generation loop)", page_no, len(page) - p * times))
    return out


def _block_key(b: Block):
    return (b.label, tuple(b.boxes), b.content)


def _tail_period(s: str, max_period: int = 200, min_times: int = 5, min_chars: int = 100):
    """(period, repeats) when the text ends with one span repeated at least min_times (min_chars in all)."""
    tail = s.rstrip()[-4000:]
    for p in range(1, min(max_period, len(tail) // min_times) + 1):
        unit = tail[-p:]
        if not unit.strip():
            continue
        times = 1
        while times * p + p <= len(tail) and tail[-(times + 1) * p:-times * p] == unit:
            times += 1
        if times >= min_times and times * p >= min_chars:
            return p, times
    return None


# ============================================================================================== geometry
def to_pixels(box: Sequence[float], size: tuple[int, int]) -> tuple[float, float, float, float]:
    """Normalised 0..999 box -> pixels on the original image: x / 999 * W, y / 999 * H."""
    w, h = size
    x1, y1, x2, y2 = box
    return (x1 / COORD_MAX * w, y1 / COORD_MAX * h, x2 / COORD_MAX * w, y2 / COORD_MAX * h)


def normalize_box(box: Sequence[float], size: tuple[int, int]) -> Box:
    """Pixel box -> the model's integer 0..999 coordinates (the inverse of to_pixels, rounded)."""
    w, h = size
    x1, y1, x2, y2 = box

    def n(v: float, side: int) -> int:
        return min(max(int(round(v / side * COORD_MAX)), 0), COORD_MAX)

    return (n(x1, w), n(y1, h), n(x2, w), n(y2, h))


def iou(a: Sequence[float] | None, b: Sequence[float] | None) -> float:
    """Intersection over union of two (x1, y1, x2, y2) boxes; 0 when either is missing or both are empty."""
    if a is None or b is None:
        return 0.0
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    if union <= 0:
        return 1.0 if tuple(a) == tuple(b) else 0.0
    return inter / union


# ============================================================================================== rendering
def block_colour(index: int, seed: int = 0) -> tuple[int, int, int]:
    """A fixed colour for the block at `index` (same index and seed, same colour)."""
    rng = random.Random(seed * 1_000_003 + index)
    return (rng.randint(0, 200), rng.randint(0, 200), rng.randint(40, 255))


def _font(size: int):
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, OSError):  # Pillow without FreeType: the fixed bitmap font
        return ImageFont.load_default()


def _pixel_rect(box: Box, size: tuple[int, int]) -> tuple[int, int, int, int]:
    w, h = size
    x1, y1, x2, y2 = to_pixels(box, size)
    x1, y1 = min(max(int(x1), 0), w - 1), min(max(int(y1), 0), h - 1)
    x2, y2 = min(max(int(x2), x1), w - 1), min(max(int(y2), y1), h - 1)
    return x1, y1, x2, y2


def render(image: Image.Image, blocks: Sequence[Block], page: int | None = None, fill_alpha: int = 40,
           seed: int = 0, font_size: int | None = None) -> Image.Image:
    """The vendor-style layout picture: per block a colour, an outline (4 px for titles, 2 otherwise), a
    translucent fill and the label above the box. `page` keeps only that page's blocks. Returns a new RGB image."""
    base = image.convert("RGBA")
    size = base.size
    font = _font(font_size or max(11, min(size) // 55))
    chosen = [b for b in blocks if page is None or b.page == page]
    for b in chosen:
        r, g, bl = block_colour(b.index, seed)
        width = 4 if b.label in TITLE_LABELS else 2
        for box in b.boxes:
            x1, y1, x2, y2 = _pixel_rect(box, size)
            patch = Image.new("RGBA", (x2 - x1 + 1, y2 - y1 + 1), (0, 0, 0, 0))
            ImageDraw.Draw(patch).rectangle((0, 0, x2 - x1, y2 - y1), fill=(r, g, bl, fill_alpha),
                                            outline=(r, g, bl, 255), width=width)
            base.alpha_composite(patch, (x1, y1))
    draw = ImageDraw.Draw(base)
    for b in chosen:
        colour = block_colour(b.index, seed) + (255,)
        for box in b.boxes:
            x1, y1, _, _ = _pixel_rect(box, size)
            text = b.label or "?"
            tb = draw.textbbox((0, 0), text, font=font)
            th = tb[3] - tb[1]
            draw.text((x1, max(0, y1 - th - tb[1] - 3)), text, fill=colour, font=font)
    return base.convert("RGB")


def image_regions(blocks: Sequence[Block]) -> list[tuple[Block, int]]:
    """(block, box number) of every `image` box in output order: crop N and `images/N.jpg` follow this list."""
    return [(b, k) for b in blocks if b.label == "image" for k in range(len(b.boxes))]


def crop_images(image: Image.Image, blocks: Sequence[Block], page: int | None = None) -> list[Image.Image]:
    """Crops of the `image` blocks (one per box), in output order."""
    out = []
    rgb = image.convert("RGB")
    w, h = rgb.size
    for b, k in image_regions([b for b in blocks if page is None or b.page == page]):
        x1, y1, x2, y2 = (int(v) for v in to_pixels(b.boxes[k], (w, h)))  # the crop's right/bottom edge is exclusive
        x1, y1 = min(x1, w - 1), min(y1, h - 1)
        out.append(rgb.crop((x1, y1, min(max(x2, x1 + 1), w), min(max(y2, y1 + 1), h))))
    return out


def to_markdown(result: ParseResult | str, image_dir: str = "images") -> str:
    """The vendor's result.mmd: the text with every block's tags removed, `image` blocks replaced by
    `![](images/N.jpg)` (one per box), pages joined with the page-split line."""
    if isinstance(result, str):
        result = parse(result)
    counter = 0
    pages = []
    for page_no, s in enumerate(result.pages):
        edits: list[tuple[int, int, str]] = [(a, b, "") for a, b in result.removed[page_no]]
        for blk in result.page_blocks(page_no):
            repl = ""
            if blk.label == "image":
                links = []
                for _ in blk.boxes:
                    links.append(f"![]({image_dir}/{counter}.jpg)\n")
                    counter += 1
                repl = "".join(links)
            edits.append((blk.span[0], blk.span[1], repl))
        out, pos = [], 0
        for a, b, repl in sorted(edits):
            if a < pos:
                continue
            out += [s[pos:a], repl]
            pos = b
        out.append(s[pos:])
        pages.append("".join(out))
    return PAGE_SPLIT.join(pages)


@dataclass
class ResultAssets:
    """Everything a vendor run writes, in memory: markdown, layout picture(s), crops."""

    parse: ParseResult
    markdown: str
    boxes_images: list[Image.Image]  # one per page image
    crops: list[Image.Image]  # images/N.jpg, N = position in this list
    files: list[Path] = field(default_factory=list)

    @property
    def boxes_image(self) -> Image.Image:
        return self.boxes_images[0]


def build_result(image: Image.Image | Sequence[Image.Image], text: str | ParseResult, seed: int = 0) -> ResultAssets:
    """Markdown, rendering and crops for one output. `image` is the page image, or one image per page (a single
    image serves every page)."""
    result = parse(text) if isinstance(text, str) else text
    images = [image] if isinstance(image, Image.Image) else list(image)
    if not images:
        raise ValueError("no page image given")
    n_pages = max(len(result.pages), 1)
    page_images = images if len(images) == n_pages else [images[0]] * n_pages
    boxes = [render(img, result.blocks, page=p if n_pages > 1 else None, seed=seed)
             for p, img in enumerate(page_images)]
    crops = []
    for p, img in enumerate(page_images):
        crops += crop_images(img, result.blocks, page=p if n_pages > 1 else None)
    return ResultAssets(result, to_markdown(result), boxes, crops)


def save_result(folder: str | Path, image: Image.Image | Sequence[Image.Image], text: str | ParseResult,
                seed: int = 0, quality: int = 90) -> ResultAssets:
    """Write result.mmd, result_with_boxes.jpg (result_with_boxes_P.jpg per page when several page images are
    given) and images/N.jpg into `folder`; returns the assets with `.files` filled."""
    folder = Path(folder)
    assets = build_result(image, text, seed)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    files = [folder / "result.mmd"]
    files[0].write_text(assets.markdown, encoding="utf-8")
    if len(assets.boxes_images) == 1:
        names = ["result_with_boxes.jpg"]
    else:
        names = [f"result_with_boxes_{p}.jpg" for p in range(len(assets.boxes_images))]
    for name, img in zip(names, assets.boxes_images):
        img.save(folder / name, quality=quality)
        files.append(folder / name)
    for n, crop in enumerate(assets.crops):
        crop.save(folder / "images" / f"{n}.jpg", quality=quality)
        files.append(folder / "images" / f"{n}.jpg")
    assets.files = files
    return assets


# ============================================================================================== comparison
@dataclass
class Divergence:
    """Where two sequences first differ. a / b are the items there (None past the end of the shorter)."""

    index: int
    a: Any
    b: Any
    line: int | None = None  # 1-based, text only
    column: int | None = None  # 1-based, text only
    context_a: Any = None  # the neighbourhood of `index` in each sequence
    context_b: Any = None


def first_divergence(a: Sequence, b: Sequence, context: int = 20) -> Divergence | None:
    """First position where two token-id lists (or two strings) differ; None when they are equal."""
    if isinstance(a, str) != isinstance(b, str):
        raise TypeError("compare two strings or two id sequences")
    a = a if isinstance(a, str) else [int(x) for x in a]
    b = b if isinstance(b, str) else [int(x) for x in b]
    n = min(len(a), len(b))
    i = next((k for k in range(n) if a[k] != b[k]), n)
    if i == n and len(a) == len(b):
        return None
    lo = max(0, i - context)
    d = Divergence(i, a[i] if i < len(a) else None, b[i] if i < len(b) else None,
                   context_a=a[lo:i + context], context_b=b[lo:i + context])
    if isinstance(a, str):
        d.line = a.count("\n", 0, i) + 1
        d.column = i - (a.rfind("\n", 0, i) + 1) + 1
    return d


@dataclass
class OutputSummary:
    name: str
    blocks: int
    pages: int
    labels: dict[str, int]
    problems: int
    problem_kinds: dict[str, int]
    characters: int


@dataclass
class BlockMatch:
    a: int  # block index in the reference output
    b: int  # block index in the other output
    iou: float
    label_a: str
    label_b: str
    same_label: bool
    content_equal: bool  # equal after collapsing whitespace
    content_ratio: float  # difflib similarity 0..1


@dataclass
class PairComparison:
    reference: str
    other: str
    n_reference: int
    n_other: int
    matches: list[BlockMatch]
    unmatched_reference: list[int]
    unmatched_other: list[int]
    precision: float  # matches / blocks of `other` (1 when both are empty, 0 when only `other` is empty)
    recall: float  # matches / blocks of `reference`
    f1: float
    mean_iou: float | None  # over matches (IoU >= threshold); None without matches
    label_agreement: float | None  # share of matches with the same label
    content_exact: float | None  # share of matches with equal content
    content_mean_ratio: float | None
    labels: dict[str, list[int]]  # label -> [count in reference, count in other]
    identical_text: bool
    text_divergence: Divergence | None
    side_by_side: list[dict]  # the first K blocks of each, position by position


@dataclass
class DetectionComparison:
    """Two or three outputs of one page compared: one-shot, separated, optionally a vendor reference."""

    iou_threshold: float
    outputs: list[OutputSummary]
    pairs: list[PairComparison]
    token_divergence: Divergence | None = None  # of the first two outputs' generated ids, when given

    @property
    def identical(self) -> bool:
        return all(p.identical_text for p in self.pairs)

    def pair(self, reference: str, other: str) -> PairComparison:
        for p in self.pairs:
            if (p.reference, p.other) == (reference, other):
                return p
        raise KeyError(f"no comparison of {reference!r} with {other!r}")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["identical"] = self.identical
        return json.loads(json.dumps(d, default=list))

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)


def _norm_text(s: str) -> str:
    return " ".join(s.split())


def _ratio(a: str, b: str) -> float:
    if a == b:
        return 1.0
    m = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return m.ratio() if len(a) + len(b) <= 8000 else m.quick_ratio()


def match_blocks(ref: Sequence[Block], other: Sequence[Block], threshold: float = 0.5) -> list[tuple[int, int, float]]:
    """Optimal one-to-one matching of blocks by IoU of their enclosing boxes (same page only). Returns
    (position in ref, position in other, IoU) for pairs with IoU >= threshold."""
    if not ref or not other:
        return []
    import numpy as np
    from scipy.optimize import linear_sum_assignment

    def boxes(blocks: Sequence[Block]):
        arr = np.array([b.bbox if b.bbox is not None else (0, 0, 0, 0) for b in blocks], dtype=float)
        has = np.array([b.bbox is not None for b in blocks])
        return arr, has, np.array([b.page for b in blocks])

    (ra, rh, rp), (oa, oh, op) = boxes(ref), boxes(other)
    ix = np.clip(np.minimum(ra[:, None, 2], oa[None, :, 2]) - np.maximum(ra[:, None, 0], oa[None, :, 0]), 0, None)
    iy = np.clip(np.minimum(ra[:, None, 3], oa[None, :, 3]) - np.maximum(ra[:, None, 1], oa[None, :, 1]), 0, None)
    inter = ix * iy
    area_r = (ra[:, 2] - ra[:, 0]) * (ra[:, 3] - ra[:, 1])
    area_o = (oa[:, 2] - oa[:, 0]) * (oa[:, 3] - oa[:, 1])
    union = area_r[:, None] + area_o[None, :] - inter
    same = (ra[:, None, :] == oa[None, :, :]).all(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        m = np.where(union > 0, inter / np.where(union > 0, union, 1), same.astype(float))  # == iou()
    m = np.where(rh[:, None] & oh[None, :] & (rp[:, None] == op[None, :]), m, 0.0)
    m = np.where(m >= threshold, m, 0.0)
    rows, cols = linear_sum_assignment(m, maximize=True)
    return [(int(i), int(j), float(m[i, j])) for i, j in zip(rows, cols) if m[i, j] >= threshold and m[i, j] > 0]


def _side_by_side(ref: ParseResult, other: ParseResult, k: int) -> list[dict]:
    rows = []
    for i in range(min(k, max(len(ref.blocks), len(other.blocks)))):
        a = ref.blocks[i] if i < len(ref.blocks) else None
        b = other.blocks[i] if i < len(other.blocks) else None
        row = {"index": i, "reference": a.to_dict() if a else None, "other": b.to_dict() if b else None,
               "same_label": bool(a and b and a.label == b.label),
               "same_boxes": bool(a and b and a.boxes == b.boxes),
               "same_content": bool(a and b and a.content == b.content),
               "iou": iou(a.bbox, b.bbox) if a and b else None, "content_diff": None}
        if a and b and a.content != b.content:
            row["content_diff"] = "\n".join(difflib.ndiff(a.content.splitlines() or [""],
                                                          b.content.splitlines() or [""]))
        rows.append(row)
    return rows


def compare_pair(ref: str | ParseResult, other: str | ParseResult, ref_name: str = "a", other_name: str = "b",
                 iou_threshold: float = 0.5, k: int = 10) -> PairComparison:
    ref_text = ref if isinstance(ref, str) else PAGE_SPLIT.join(ref.pages)
    other_text = other if isinstance(other, str) else PAGE_SPLIT.join(other.pages)
    pr = parse(ref) if isinstance(ref, str) else ref
    po = parse(other) if isinstance(other, str) else other
    matches = []
    for i, j, v in match_blocks(pr.blocks, po.blocks, iou_threshold):
        a, b = pr.blocks[i], po.blocks[j]
        ca, cb = _norm_text(a.content), _norm_text(b.content)
        matches.append(BlockMatch(a.index, b.index, v, a.label, b.label, a.label == b.label, ca == cb, _ratio(ca, cb)))
    matches.sort(key=lambda m: m.a)
    na, nb, nm = len(pr.blocks), len(po.blocks), len(matches)
    precision = nm / nb if nb else (1.0 if na == 0 else 0.0)
    recall = nm / na if na else (1.0 if nb == 0 else 0.0)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    mean = (lambda xs: sum(xs) / len(xs) if xs else None)
    la, lb = pr.labels(), po.labels()
    return PairComparison(
        ref_name, other_name, na, nb, matches,
        sorted(set(b.index for b in pr.blocks) - {m.a for m in matches}),
        sorted(set(b.index for b in po.blocks) - {m.b for m in matches}),
        precision, recall, f1, mean([m.iou for m in matches]),
        mean([float(m.same_label) for m in matches]), mean([float(m.content_equal) for m in matches]),
        mean([m.content_ratio for m in matches]),
        {lab: [la.get(lab, 0), lb.get(lab, 0)] for lab in sorted(set(la) | set(lb))},
        ref_text == other_text, first_divergence(ref_text, other_text), _side_by_side(pr, po, k))


def compare_outputs(one_shot: str | ParseResult, separated: str | ParseResult,
                    vendor: str | ParseResult | None = None, names: Sequence[str] = ("one-shot", "separated", "vendor"),
                    ids_a: Sequence[int] | None = None, ids_b: Sequence[int] | None = None,
                    iou_threshold: float = 0.5, k: int = 10) -> DetectionComparison:
    """Compare the outputs of one page. Pairs: (one-shot, separated) and, with a vendor text, (vendor, one-shot)
    and (vendor, separated); the first of a pair is the reference (recall is over its blocks). ids_a / ids_b are
    the generated token ids of the first two, for the first diverging token."""
    texts = [one_shot, separated] + ([vendor] if vendor is not None else [])
    names = list(names)[:len(texts)]
    if len(names) < len(texts) or len(set(names)) != len(names):
        raise ValueError(f"need {len(texts)} distinct names, got {names}")
    parsed = [parse(t) if isinstance(t, str) else t for t in texts]
    raw = [t if isinstance(t, str) else PAGE_SPLIT.join(t.pages) for t in texts]
    outputs = [OutputSummary(n, len(p.blocks), len(p.pages), p.labels(), len(p.problems),
                             dict(Counter(q.kind for q in p.problems)), len(r))
               for n, p, r in zip(names, parsed, raw)]
    order = [(0, 1)] + ([(2, 0), (2, 1)] if vendor is not None else [])
    pairs = [compare_pair(parsed[i], parsed[j], names[i], names[j], iou_threshold, k) for i, j in order]
    tokens = first_divergence(list(ids_a), list(ids_b)) if ids_a is not None and ids_b is not None else None
    return DetectionComparison(iou_threshold, outputs, pairs, tokens)
