"""Real page sets for dataset runs: discover pages (images and PDF pages), sample them, load them.

A data set is given as a folder (searched recursively; hidden files and folders skipped; image files and PDFs
by extension, everything else ignored), as a text file listing one path per line (relative to the list's
folder, or absolute; blank lines and lines starting with `#` skipped), or as one image or PDF file. PDFs are
split into pages, rendered when loaded at `dpi` (144 by default, as the vendor does) with pypdfium2; without it,
PDF pages are listed as unreadable.

Every page has a stable name: its path relative to the data set's root (the folder, or the list's folder) in
POSIX form, plus its 0-based page index for PDF pages. A sample is a page in an epoch; (name, pdf_page, epoch)
is its store key, so a resumed run finds the pages it already measured.

Sampling: each epoch takes `n` pages (all when None), in listed order ("fixed") or shuffled ("random") by a
generator seeded from (seed, epoch) alone. So a run with more epochs or a larger `n` extends, rather than
reshuffles, the samples of a smaller run with the same seed. `n` larger than the data set is clamped (a page
appears at most once per epoch, so keys stay unique).

Pages that cannot be used (missing file, PDF that does not open, corrupt image) are still listed and sampled; they
fail when loaded (ImageError), and a dataset run records them as errors.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Sequence

from PIL import Image

from ..runtime.inputs import MAX_PIXELS, ImageError, load_image, pixel_limit_message

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff", ".gif")
PDF_SUFFIX = ".pdf"
DEFAULT_DPI = 144  # the vendor renders PDF pages at 144 dpi
Order = Literal["random", "fixed"]


class DatasetError(ValueError):
    """A data set that cannot be used at all (no such folder or list, no pages, bad sampling options)."""


@dataclass(frozen=True)
class Page:
    """One page of a data set."""

    path: Path  # absolute file path
    name: str  # path relative to the data set root (POSIX), or the absolute path for a list entry outside it
    pdf_page: int | None = None  # 0-based page index inside a PDF; None for image files
    pdf_pages: int | None = None  # pages in that PDF
    error: str | None = None  # known unreadable at discovery (missing file, PDF that does not open)

    @property
    def is_pdf(self) -> bool:
        return self.path.suffix.lower() == PDF_SUFFIX

    @property
    def label(self) -> str:
        """Human name: `docs/a.pdf p3` (1-based page number) or `scans/b.png`."""
        return self.name if self.pdf_page is None else f"{self.name} p{self.pdf_page + 1}"


@dataclass(frozen=True)
class Sample:
    """A page as measured in one epoch."""

    page: Page
    epoch: int

    @property
    def key(self) -> dict:
        """The run-store point key: stable across runs and resumes."""
        return {"page": self.page.name, "pdf_page": self.page.pdf_page, "epoch": self.epoch}

    @property
    def label(self) -> str:
        return f"{self.page.label} (epoch {self.epoch})"


@dataclass
class Dataset:
    source: Path  # the folder, list file or page file given (resolved)
    root: Path  # what page names are relative to
    pages: list[Page]
    notes: list[str] = field(default_factory=list)  # e.g. PDFs skipped for lack of pypdfium2

    def describe(self) -> dict:
        return {"source": str(self.source), "root": str(self.root), "pages": len(self.pages),
                "pdf_pages": sum(p.pdf_page is not None for p in self.pages),
                "unreadable_at_discovery": sum(p.error is not None for p in self.pages), "notes": list(self.notes)}


# ---------------------------------------------------------------------------------------------- discovery
def _pdfium():
    try:
        import pypdfium2
    except ImportError:
        return None
    return pypdfium2


def _name(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()


def _pdf_pages(path: Path, name: str, notes: list[str]) -> list[Page]:
    pdfium = _pdfium()
    if pdfium is None:
        msg = "PDF pages need pypdfium2 (pip install pypdfium2)"
        if msg not in notes:
            notes.append(msg)
        return [Page(path, name, error=msg)]
    try:
        doc = pdfium.PdfDocument(str(path))
        try:
            n = len(doc)
        finally:
            doc.close()
    except Exception as exc:  # noqa: BLE001 - pdfium raises PdfiumError, OSError, ...
        return [Page(path, name, error=f"{name}: cannot open the PDF ({str(exc).strip() or type(exc).__name__})"[:300])]
    if n == 0:
        return [Page(path, name, error=f"{name}: the PDF has no pages")]
    return [Page(path, name, i, n) for i in range(n)]


def _entry(path: Path, root: Path, notes: list[str]) -> list[Page]:
    name = _name(path, root)
    if not path.is_file():
        return [Page(path, name, error=f"{name}: file not found")]
    if path.suffix.lower() == PDF_SUFFIX:
        return _pdf_pages(path, name, notes)
    return [Page(path, name)]


def _hidden(rel: Path) -> bool:
    return any(part.startswith(".") for part in rel.parts)


def discover(source: str | Path, recursive: bool = True) -> Dataset:
    """The pages of a folder or of a list file (see the module docstring). Raises DatasetError when `source`
    does not exist or holds no page."""
    source = Path(source).expanduser()
    notes: list[str] = []
    pages: list[Page] = []
    if source.is_dir():
        root = source.resolve()
        walk = root.rglob("*") if recursive else root.glob("*")
        files = sorted((p for p in walk if p.is_file() and not _hidden(p.relative_to(root))
                        and p.suffix.lower() in (*IMAGE_SUFFIXES, PDF_SUFFIX)),
                       key=lambda p: p.relative_to(root).as_posix())
        for path in files:
            pages += _entry(path, root, notes)
    elif source.is_file() and source.suffix.lower() in (*IMAGE_SUFFIXES, PDF_SUFFIX):
        root = source.resolve().parent  # one image or one PDF: a data set of its pages
        pages = _entry(source.resolve(), root, notes)
    elif source.is_file():
        root = source.resolve().parent
        try:
            lines = source.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError:
            raise DatasetError(f"{source}: not a UTF-8 text file; give a folder of pages or a list of paths") from None
        seen: set[Path] = set()
        for line in lines:
            entry = line.strip()
            if not entry or entry.startswith("#"):
                continue
            path = Path(entry).expanduser()
            path = (path if path.is_absolute() else root / path).resolve()
            if path in seen:
                continue
            seen.add(path)
            pages += _entry(path, root, notes)
    else:
        raise DatasetError(f"no such folder or list file: {source}")
    if not pages:
        what = "image or PDF files" if source.is_dir() else "entries"
        raise DatasetError(f"{source}: no pages found (no {what})")
    return Dataset(source.resolve(), root, pages, notes)


# ---------------------------------------------------------------------------------------------- sampling
def sample(pages: Sequence[Page], n: int | None = None, epochs: int = 1, seed: int = 0,
           order: Order = "random") -> list[Sample]:
    """Samples for `epochs` epochs of `n` pages each (see the module docstring), epoch by epoch."""
    if order not in ("random", "fixed"):
        raise DatasetError(f"order must be 'random' or 'fixed', got {order!r}")
    if epochs < 1:
        raise DatasetError(f"epochs must be at least 1, got {epochs}")
    if n is not None and n < 1:
        raise DatasetError(f"the number of pages per epoch must be at least 1, got {n}")
    if not pages:
        raise DatasetError("no pages to sample from")
    take = len(pages) if n is None else min(n, len(pages))
    out: list[Sample] = []
    for epoch in range(epochs):
        index = list(range(len(pages)))
        if order == "random":
            # str seeds are hashed with SHA-512 by random.Random: the same on every machine and Python run
            random.Random(f"dsocr-dataset:{seed}:{epoch}").shuffle(index)
        out += [Sample(pages[i], epoch) for i in index[:take]]
    return out


# ---------------------------------------------------------------------------------------------- loading
def pdf_pixels(w_pt: float, h_pt: float, dpi: int) -> tuple[int, int]:
    """The pixel size pdfium renders a page of w_pt x h_pt points at `dpi`: it rounds up (595.2 pt at 144 dpi is
    1,191 px, not round()'s 1,190), so a page is listed at the size it is stored at."""
    return math.ceil(w_pt * dpi / 72), math.ceil(h_pt * dpi / 72)


def render_pdf_page(path: str | Path, index: int, dpi: int = DEFAULT_DPI, max_pixels: int = MAX_PIXELS) -> Image.Image:
    """Page `index` (0-based) of a PDF rendered at `dpi` as an RGB image. Raises ImageError."""
    if not 18 <= dpi <= 1200:
        raise ImageError(f"dpi must lie in 18..1200, got {dpi}")
    pdfium = _pdfium()
    if pdfium is None:
        raise ImageError("PDF pages need pypdfium2 (pip install pypdfium2)")
    path = Path(path)
    try:
        doc = pdfium.PdfDocument(str(path))
    except Exception as exc:  # noqa: BLE001
        raise ImageError(f"{path}: cannot open the PDF ({str(exc).strip() or type(exc).__name__})"[:300]) from None
    try:
        if not 0 <= index < len(doc):
            raise ImageError(f"{path}: no page {index + 1} (the PDF has {len(doc)})")
        page = doc[index]
        try:
            w_pt, h_pt = page.get_size()
            w, h = pdf_pixels(w_pt, h_pt, dpi)
            if w <= 0 or h <= 0:
                raise ImageError(f"{path} page {index + 1}: zero size")
            if w * h > max_pixels:  # refuse before rendering, not after allocating
                raise ImageError(f"{path} page {index + 1} at {dpi} dpi: "
                                 f"{pixel_limit_message(w * h, (w, h), max_pixels, 'PDF page')}")
            image = page.render(scale=dpi / 72).to_pil()
        finally:
            page.close()
    except ImageError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise ImageError(f"{path} page {index + 1}: cannot render ({str(exc).strip() or type(exc).__name__})"[:300]
                         ) from None
    finally:
        doc.close()
    return load_image(image, max_pixels)


def load_page(page: Page, dpi: int = DEFAULT_DPI, max_pixels: int = MAX_PIXELS) -> Image.Image:
    """The page as an RGB image (EXIF applied for images, rendered at `dpi` for PDF pages). Raises ImageError."""
    if page.error is not None:
        raise ImageError(page.error)
    if page.pdf_page is not None:
        return render_pdf_page(page.path, page.pdf_page, dpi, max_pixels)
    return load_image(page.path, max_pixels)


def thumbnail(page: Page, max_side: int = 256, dpi: int = 36) -> Image.Image:
    """A small RGB picture of the page, at most `max_side` pixels on its longer side (PDF pages rendered at a low
    `dpi` first). Raises ImageError, as load_page does."""
    if page.error is not None:
        raise ImageError(page.error)
    image = render_pdf_page(page.path, page.pdf_page, dpi) if page.pdf_page is not None else load_image(page.path)
    image.thumbnail((max_side, max_side))
    return image
