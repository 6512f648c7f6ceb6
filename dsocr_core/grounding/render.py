"""Grounding output, drawn the vendor's way: the layout picture (a colour per block, outline 4 px for titles and
2 px otherwise, translucent fill, label above the box), `image` regions cropped to images/N.jpg, result.mmd (tags
removed, images linked) and the result assets that bundle them."""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from PIL import Image, ImageDraw, ImageFont

from ..runtime.image_modes import to_rgb
from .parse import PAGE_SPLIT, Block, Box, ParseResult, parse, to_pixels

TITLE_LABELS = ("title",)  # outlined 4 px wide; every other label 2 px


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
    base = to_rgb(image).convert("RGBA")  # a 16-bit page is drawn as its tones, not clipped white
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
    rgb = to_rgb(image)
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
