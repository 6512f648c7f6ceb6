"""The project's own sample pages: document-like pages drawn with PIL (title, paragraphs, a table, a figure,
captions) in several sizes and aspect ratios, each with the model-style grounding text describing its layout.

Everything here is drawn by this module from a fixed seed; no vendor page is used. `write_samples(folder)` writes
NAME.png, NAME.grounding.txt and index.json; `python -m dsocr_core samples --out data/samples` calls it.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import PIL
from PIL import Image, ImageDraw, ImageFont

from .parse import normalize_box
from ..tiling import HF_CROP_RANGE, VLLM_CROP_RANGE, crop_grid, token_counts

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "data" / "samples"
INDEX_NAME = "index.json"

INK = (25, 25, 30)
GREY = (90, 90, 100)
RULE = (150, 150, 160)
PAPER = (255, 255, 255)
BAR_COLOURS = [(52, 101, 164), (204, 102, 51), (78, 154, 6), (117, 80, 123), (193, 125, 17), (46, 52, 54)]


@dataclass(frozen=True)
class PageSpec:
    name: str
    width: int
    height: int
    title: str
    columns: int = 1
    seed: int = 0
    paragraphs: int = 3
    table_rows: int = 4
    table_cols: int = 3
    bars: int = 5
    note: str = ""


PAGES: tuple[PageSpec, ...] = (
    PageSpec("a4_portrait", 1240, 1754, "Quarterly Operations Report", seed=1, paragraphs=4, table_rows=6,
             note="A4 at 150 dpi"),
    PageSpec("letter", 1275, 1650, "Field Survey Summary", seed=2, paragraphs=3, table_rows=5, table_cols=4,
             note="US letter at 150 dpi"),
    PageSpec("landscape", 1920, 1080, "Network Capacity Review", columns=2, seed=3, paragraphs=3, table_rows=5,
             table_cols=4, bars=7, note="16:9 slide; tiles 4x2 under HF (2..9), 2x1 under vLLM (2..6)"),
    PageSpec("small", 640, 832, "Weekly Training Plan", seed=4, paragraphs=2, table_rows=3, bars=4,
             note="the vendor example's size (640x832)"),
    PageSpec("square", 1024, 1024, "Product Sheet", seed=5, paragraphs=2, table_rows=4, bars=5),
    PageSpec("receipt", 600, 1800, "Order Receipt", seed=6, paragraphs=3, table_rows=8, table_cols=2, bars=3,
             note="tall strip; tiles 1x3"),
    PageSpec("card", 620, 440, "Visitor Card", seed=7, paragraphs=1, table_rows=2, table_cols=2, bars=3,
             note="no side above 640 pixels: global view only, no tiles"),
)

WORDS = ("system data report value team plan review result method process period total growth margin "
         "service network region survey sample measure schedule budget target record level change trend update "
         "capacity station metric quality output input cost delivery partner project stage status summary "
         "analysis figure table section note detail market supply demand order storage energy traffic route "
         "device share rate index average annual weekly monthly early late strong stable small large first final "
         "shows remains increased decreased improved reached exceeded covers includes follows expected reported "
         "across within during after before between under over about the of and for with in on to a by").split()


@dataclass
class DrawnBlock:
    label: str
    box: tuple[int, int, int, int]  # pixels (x1, y1, x2, y2) of what was drawn
    content: str

    def to_dict(self) -> dict:
        return {"label": self.label, "box": list(self.box), "content": self.content}


@dataclass
class SamplePage:
    spec: PageSpec
    image: Image.Image
    blocks: list[DrawnBlock] = field(default_factory=list)

    @property
    def size(self) -> tuple[int, int]:
        return self.image.size

    def grounding_text(self) -> str:
        return grounding_text(self.blocks, self.size)


def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    return ImageFont.load_default(size=size)


def _sentence(rng: random.Random, lo: int = 8, hi: int = 16) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(lo, hi))]
    return " ".join(words).capitalize() + "."


def _wrap(draw: ImageDraw.ImageDraw, text: str, font, width: int) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        trial = f"{line} {word}".strip()
        if draw.textlength(trial, font=font) <= width or not line:
            line = trial
        else:
            lines.append(line)
            line = word
    if line:
        lines.append(line)
    return lines


def _union(boxes: list[tuple[int, int, int, int]]) -> tuple[int, int, int, int]:
    return (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes))


class _Layout:
    """Top-to-bottom flow in one or more columns; an element that does not fit moves to the next column."""

    def __init__(self, spec: PageSpec, draw: ImageDraw.ImageDraw):
        w, h = spec.width, spec.height
        self.margin = max(24, round(min(w, h) * 0.06))
        self.gap = max(12, round(min(w, h) * 0.03))
        inner = w - 2 * self.margin - (spec.columns - 1) * self.gap
        self.col_w = inner // spec.columns
        self.columns = [self.margin + c * (self.col_w + self.gap) for c in range(spec.columns)]
        self.col = 0
        self.top = self.margin
        self.y = self.top
        self.bottom = h - self.margin
        self.draw = draw

    @property
    def x(self) -> int:
        return self.columns[self.col]

    def fits(self, height: int) -> bool:
        if self.y + height <= self.bottom:
            return True
        if self.col + 1 < len(self.columns):
            self.col += 1
            self.y = self.top
            return self.y + height <= self.bottom
        return False


def draw_page(spec: PageSpec) -> SamplePage:
    """Draw one page. Deterministic: the same spec gives the same pixels and blocks (for one Pillow version)."""
    rng = random.Random(spec.seed)
    image = Image.new("RGB", (spec.width, spec.height), PAPER)
    draw = ImageDraw.Draw(image)
    page = SamplePage(spec, image)
    unit = min(spec.width, spec.height)
    body = _font(max(11, round(unit / 55)))
    small = _font(max(10, round(unit / 65)))
    lay = _Layout(spec, draw)

    # title across the full width
    title_font = _font(max(18, round(unit / 22)))
    title_lines = _wrap(draw, spec.title, title_font, spec.width - 2 * lay.margin)
    boxes, y = [], lay.y
    for line in title_lines:
        bb = draw.textbbox((lay.margin, y), line, font=title_font)
        draw.text((lay.margin, y), line, font=title_font, fill=INK)
        boxes.append(bb)
        y = bb[3] + round(title_font.size * 0.3)
    page.blocks.append(DrawnBlock("title", _union(boxes), "# " + spec.title))
    rule_y = y + lay.gap // 3
    draw.line((lay.margin, rule_y, spec.width - lay.margin, rule_y), fill=RULE, width=2)
    lay.top = lay.y = rule_y + lay.gap

    def paragraph(text: str) -> None:
        lines = _wrap(draw, text, body, lay.col_w)
        line_h = round(body.size * 1.35)
        if not lay.fits(line_h * len(lines)):
            return
        bxs, y0 = [], lay.y
        for k, line in enumerate(lines):
            pos = (lay.x, y0 + k * line_h)
            draw.text(pos, line, font=body, fill=INK)
            bxs.append(draw.textbbox(pos, line, font=body))
        page.blocks.append(DrawnBlock("text", _union(bxs), text))
        lay.y = y0 + line_h * len(lines) + lay.gap

    def caption(label: str, text: str) -> bool:
        lines = _wrap(draw, text, small, lay.col_w)
        line_h = round(small.size * 1.3)
        if not lay.fits(line_h * len(lines)):
            return False
        bxs = []
        for k, line in enumerate(lines):
            pos = (lay.x, lay.y + k * line_h)
            draw.text(pos, line, font=small, fill=GREY)
            bxs.append(draw.textbbox(pos, line, font=small))
        page.blocks.append(DrawnBlock(label, _union(bxs), text))
        lay.y += line_h * len(lines) + lay.gap // 2
        return True

    def table(number: int) -> None:
        rows, cols = spec.table_rows, spec.table_cols
        row_h = round(small.size * 1.9)
        cap = f"Table {number}: {_sentence(rng, 4, 7)}"
        needed = row_h * (rows + 1) + round(small.size * 1.3) * 2 + lay.gap
        if not lay.fits(needed):
            return
        caption("table_caption", cap)
        x0, y0 = lay.x, lay.y
        col_w = lay.col_w // cols
        header = [rng.choice(("Region", "Item", "Stage", "Metric", "Site"))] + \
                 [rng.choice(("Q1", "Q2", "Q3", "Q4", "Plan", "Actual", "Delta", "Share")) for _ in range(cols - 1)]
        cells = [header]
        for r in range(rows):
            cells.append([f"{rng.choice(WORDS).capitalize()} {r + 1}"] +
                         [f"{rng.randint(1, 999)}.{rng.randint(0, 9)}" for _ in range(cols - 1)])
        x1, y1 = x0 + col_w * cols, y0 + row_h * (rows + 1)
        draw.rectangle((x0, y0, x1, y0 + row_h), fill=(232, 236, 242))
        for r in range(rows + 2):
            draw.line((x0, y0 + r * row_h, x1, y0 + r * row_h), fill=RULE, width=1)
        for c in range(cols + 1):
            draw.line((x0 + c * col_w, y0, x0 + c * col_w, y1), fill=RULE, width=1)
        for r, row in enumerate(cells):
            for c, text in enumerate(row):
                while draw.textlength(text, font=small) > col_w - 8 and len(text) > 1:
                    text = text[:-1]
                    row[c] = text
                draw.text((x0 + c * col_w + 5, y0 + r * row_h + (row_h - small.size) // 2), text, font=small,
                          fill=INK)
        html = "<table>" + "".join("<tr>" + "".join(f"<td>{t}</td>" for t in row) + "</tr>" for row in cells) + \
               "</table>"
        page.blocks.append(DrawnBlock("table", (x0, y0, x1, y1), html))
        lay.y = y1 + lay.gap

    def figure(number: int) -> None:
        fig_h = min(round(lay.col_w * 0.55), round(spec.height * 0.3))
        needed = fig_h + round(small.size * 1.3) * 2 + lay.gap
        if not lay.fits(needed):
            fig_h = lay.bottom - lay.y - round(small.size * 1.3) * 2 - lay.gap
            if fig_h < 60:
                return
        x0, y0, x1, y1 = lay.x, lay.y, lay.x + lay.col_w, lay.y + fig_h
        draw.rectangle((x0, y0, x1, y1), fill=(246, 247, 250), outline=RULE, width=1)
        pad = max(8, fig_h // 10)
        ax0, ay0, ax1, ay1 = x0 + pad, y0 + pad, x1 - pad, y1 - pad
        draw.line((ax0, ay1, ax1, ay1), fill=INK, width=2)
        draw.line((ax0, ay0, ax0, ay1), fill=INK, width=2)
        slot = (ax1 - ax0) / spec.bars
        for k in range(spec.bars):
            hgt = rng.uniform(0.2, 0.95) * (ay1 - ay0 - 4)
            bx0 = round(ax0 + k * slot + slot * 0.2)
            draw.rectangle((bx0, round(ay1 - hgt), round(bx0 + slot * 0.6), ay1 - 1),
                           fill=BAR_COLOURS[k % len(BAR_COLOURS)])
        page.blocks.append(DrawnBlock("image", (x0, y0, x1, y1), ""))
        lay.y = y1 + lay.gap // 2
        caption("image_caption", f"Figure {number}: {_sentence(rng, 4, 8)}")
        lay.y += lay.gap // 2

    head_font = _font(max(14, round(unit / 36)))
    sections = iter(("1 Overview", "2 Results", "3 Outlook", "4 Notes"))

    def heading() -> None:
        text = next(sections)
        bb = draw.textbbox((0, 0), text, font=head_font)
        if not lay.fits(bb[3] + lay.gap):
            return
        pos = (lay.x, lay.y)
        draw.text(pos, text, font=head_font, fill=INK)
        box = draw.textbbox(pos, text, font=head_font)
        page.blocks.append(DrawnBlock("sub_title", box, "## " + text))
        lay.y = box[3] + lay.gap // 2

    texts = [" ".join(_sentence(rng) for _ in range(rng.randint(2, 4))) for _ in range(spec.paragraphs)]
    order = ["h", "p", "table", "h", "p", "figure"] + ["p"] * (spec.paragraphs - 2)
    if spec.columns > 1:  # text and table left, figure and the rest right
        order = ["h", "p", "p", "table", "col", "figure", "h", "p"] + ["p"] * (spec.paragraphs - 3)
    p = 0
    for item in order:
        if item == "h":
            if p < len(texts):  # a heading only where a paragraph follows
                heading()
        elif item == "p" and p < len(texts):
            paragraph(texts[p])
            p += 1
        elif item == "table":
            table(1)
        elif item == "figure":
            figure(1)
        elif item == "col" and lay.col + 1 < len(lay.columns):
            lay.col, lay.y = lay.col + 1, lay.top
    return page


def grounding_text(blocks: list[DrawnBlock], size: tuple[int, int]) -> str:
    """The model-style output for drawn blocks: tags with 0..999 coordinates, content on the next line."""
    parts = []
    for b in blocks:
        x1, y1, x2, y2 = normalize_box(b.box, size)
        parts.append(f"<|ref|>{b.label}<|/ref|><|det|>[[{x1}, {y1}, {x2}, {y2}]]<|/det|>\n{b.content}\n\n")
    return "".join(parts)


def page_record(page: SamplePage) -> dict:
    w, h = page.size
    hf = crop_grid(w, h, "gundam", *HF_CROP_RANGE)
    vl = crop_grid(w, h, "gundam", *VLLM_CROP_RANGE)
    return {
        "name": page.spec.name, "file": f"{page.spec.name}.png", "grounding": f"{page.spec.name}.grounding.txt",
        "width": w, "height": h, "note": page.spec.note,
        "gundam_hf": {"crop_range": list(HF_CROP_RANGE), "grid": list(hf),
                      "image_slots": token_counts("gundam", hf).image_slots},
        "gundam_vllm": {"crop_range": list(VLLM_CROP_RANGE), "grid": list(vl),
                        "image_slots": token_counts("gundam", vl).image_slots},
        "labels": sorted({b.label for b in page.blocks}),
        "blocks": [b.to_dict() for b in page.blocks],
    }


def write_samples(out: str | Path = DEFAULT_DIR, specs: tuple[PageSpec, ...] = PAGES) -> list[dict]:
    """Draw every page into `out`: NAME.png (palette PNG, optimised), NAME.grounding.txt, index.json."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    records = []
    for spec in specs:
        page = draw_page(spec)
        # 64 colours keep text anti-aliasing and the figure's flat colours while keeping the files small
        page.image.quantize(colors=64, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
            out / f"{spec.name}.png", optimize=True)
        (out / f"{spec.name}.grounding.txt").write_text(page.grounding_text(), encoding="utf-8")
        records.append(page_record(page))
    index = {"generator": "python -m dsocr_core samples", "pillow": PIL.__version__,
             "coordinates": "grounding boxes are 0..999 of the page width/height; blocks[].box are pixels",
             "pages": records}
    (out / INDEX_NAME).write_text(json.dumps(index, indent=1) + "\n", encoding="utf-8")
    return records


def load_index(folder: str | Path = DEFAULT_DIR) -> dict | None:
    path = Path(folder) / INDEX_NAME
    if not path.exists():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def sample_pages(folder: str | Path = DEFAULT_DIR) -> list[Path]:
    """Paths of the bundled sample page images, in index order (empty when none are present)."""
    folder = Path(folder)
    index = load_index(folder)
    if index is None:
        return sorted(folder.glob("*.png")) if folder.is_dir() else []
    return [folder / rec["file"] for rec in index["pages"] if (folder / rec["file"]).exists()]


def sample_grounding(name: str, folder: str | Path = DEFAULT_DIR) -> str:
    """The grounding text stored with a sample page."""
    return (Path(folder) / f"{name}.grounding.txt").read_text(encoding="utf-8")
