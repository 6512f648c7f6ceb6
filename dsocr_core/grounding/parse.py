"""Grounding output, read: blocks, problems, the parser and the 0..999 coordinate helpers.

The model writes blocks like

    <|ref|>title<|/ref|><|det|>[[x1, y1, x2, y2], ...]<|/det|>
    # The title text

with integer coordinates 0..999 relative to the ORIGINAL page (x_px = x / 999 * W). PDF pages are joined with
`<--- Page Split --->`. The parser never raises on model output: whatever it cannot read (unclosed or truncated
tags, bad coordinates, loops cut mid-tag) becomes a Problem next to the blocks it could read.
"""
from __future__ import annotations

import dataclasses
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

REF_OPEN, REF_CLOSE, DET_OPEN, DET_CLOSE = "<|ref|>", "<|/ref|>", "<|det|>", "<|/det|>"
PAGE_SPLIT = "<--- Page Split --->"
EOS_TEXTS = ("<｜end▁of▁sentence｜>",)  # the decoded EOS the vendor strips from the end of the output
COORD_MAX = 999
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
