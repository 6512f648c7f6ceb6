"""Page files uploaded by a user (images, PDFs, zips of them), kept in a folder under generated names.

Every file is checked before it is kept; what cannot be used is returned as a `Rejected` (its name and the reason,
one line) and never written:

* empty files, files over `Limits.max_file_bytes`;
* images: decoded fully (runtime.inputs.load_image: truncated, corrupt, zero-size and decompression-bomb images
  are refused; the pixel limit reads as `pixel_limit_message`, the one wording the dashboard uses);
* PDFs (`%PDF-` in the first KiB): opened with pypdfium2; password-protected, unopenable and page-less PDFs are
  refused. PDF pages are rendered when a run loads them (at its dpi, 144 as the vendor does); a page that would be
  over the pixel limit at that dpi is marked unreadable in the data set (`UploadStore.dataset`) with the reason,
  so a run records it as an error and goes on;
* zips: opened member by member, never extracted to disk by name. At most `max_zip_members` members and
  `max_zip_bytes` unpacked in all (checked against the declared sizes first, then against the bytes really read,
  so a zip bomb whose headers lie stops at the limit); encrypted members, zips inside zips, non-page files are
  rejected one by one; folders, hidden files and macOS resource forks (`__MACOSX/`) are ignored.

Kept files are named `<content hash>.<extension of the detected format>` (never the user's file name, which is
only shown), with a `<hash>.json` sidecar holding the original name, size, kind, pixel size, PDF page sizes and
when it was added. The same content uploaded twice is kept once. `UploadStore.dataset()` turns a choice of uploads
into a measure.datasets.Dataset for a dataset run; a page's stored path (content-addressed) is what two runs over
the same uploads share.

Nothing here imports torch at import time (the dashboard's pages without a model stay light).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..runtime.image_limits import pixel_limit_message  # noqa: F401 - the one wording, re-exported for the UI

IMAGE_FORMATS = {"PNG": ".png", "JPEG": ".jpg", "WEBP": ".webp", "BMP": ".bmp", "TIFF": ".tif", "GIF": ".gif",
                 "MPO": ".jpg"}  # Pillow format -> stored extension (datasets.IMAGE_SUFFIXES)
ACCEPTED = ("png", "jpg", "jpeg", "webp", "bmp", "tif", "tiff", "gif", "pdf", "zip")  # for the upload widget
MAX_NAME = 200  # characters of an original name kept for display
_ID = re.compile(r"^[0-9a-f]{32}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


@dataclass(frozen=True)
class Limits:
    max_file_bytes: int = 256 * 1024 * 1024  # one uploaded file, or one member of a zip
    max_zip_members: int = 1000
    max_zip_bytes: int = 1024 * 1024 * 1024  # all members of one zip, unpacked
    max_pdf_pages: int = 2000


@dataclass(frozen=True)
class Upload:
    """One kept page file."""

    id: str  # content hash (32 hex digits)
    file: str  # stored file name: id + extension
    name: str  # the user's file name (zip members: "archive.zip/inner/page.png"); shown, never used as a path
    kind: str  # "image" | "pdf"
    bytes: int
    width: int | None = None  # image pixels; PDFs: the first page at 144 dpi
    height: int | None = None
    pages: int = 1
    page_sizes_pt: tuple = ()  # PDFs: (width, height) of every page in points
    added: float = 0.0  # time.time() when kept

    @property
    def size_text(self) -> str:
        return f"{self.width} x {self.height}" if self.width else "?"


@dataclass(frozen=True)
class Rejected:
    name: str
    reason: str


@dataclass
class AddResult:
    added: list[Upload] = field(default_factory=list)  # newly kept
    existing: list[Upload] = field(default_factory=list)  # the same content was already kept
    rejected: list[Rejected] = field(default_factory=list)

    def extend(self, other: "AddResult") -> None:
        self.added += other.added
        self.existing += other.existing
        self.rejected += other.rejected


# ---------------------------------------------------------------------------------------------- messages
def page_problem(message: str) -> str:
    """runtime.inputs.load_image's message for a page without the 'image data (N bytes): ' prefix of byte sources
    (the caller names the file). Every 'too many pixels' refusal is already worded one way there
    (runtime.inputs.pixel_limit_message, re-exported here)."""
    return re.sub(r"^image data \(\d+ bytes\): ", "", message)


def display_name(name: str) -> str:
    """A user's file name as it is shown: control characters dropped, at most MAX_NAME characters."""
    name = _CONTROL.sub("", str(name)).strip() or "unnamed"
    return name if len(name) <= MAX_NAME else name[:MAX_NAME - 1] + "…"


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB" if n < 2**30 else f"{n / 2**30:,.2f} GiB"


# ---------------------------------------------------------------------------------------------- checks
def _check_pdf(data: bytes, limits: Limits) -> dict:
    """{pages, page_sizes_pt, width, height} of a usable PDF, else ValueError(reason)."""
    from .datasets import DEFAULT_DPI, _pdfium, pdf_pixels

    pdfium = _pdfium()
    if pdfium is None:
        raise ValueError("PDF pages need pypdfium2 (pip install pypdfium2)")
    try:
        doc = pdfium.PdfDocument(data)
    except Exception as exc:  # noqa: BLE001 - PdfiumError and friends
        text = str(exc).strip() or type(exc).__name__
        if "password" in text.lower():
            raise ValueError("the PDF is password-protected; save it without a password and upload it again") from None
        raise ValueError(f"cannot open the PDF ({text.splitlines()[0][:200]})") from None
    try:
        n = len(doc)
        if n == 0:
            raise ValueError("the PDF has no pages")
        if n > limits.max_pdf_pages:
            raise ValueError(f"the PDF has {n:,} pages; at most {limits.max_pdf_pages:,} per file")
        sizes = []
        for i in range(n):
            try:
                page = doc[i]
            except Exception as exc:  # noqa: BLE001 - pdfium's PdfiumError("Failed to load page."): a damaged file
                raise ValueError(f"the PDF is damaged: page {i + 1} cannot be read "
                                 f"({(str(exc).strip() or type(exc).__name__).splitlines()[0][:200]})") from None
            try:
                w, h = page.get_size()
            finally:
                page.close()
            sizes.append((float(w), float(h)))  # unrounded: the pixel size is computed from them as pdfium does
    finally:
        doc.close()
    width, height = pdf_pixels(*sizes[0], DEFAULT_DPI)
    return {"pages": n, "page_sizes_pt": tuple(sizes), "width": width, "height": height}


def _check_image(data: bytes) -> dict:
    """{width, height, ext} of a usable page image (decoded fully), else ValueError(reason)."""
    from PIL import Image

    from ..runtime.inputs import ImageError, load_image

    try:
        image = load_image(data)
    except ImageError as exc:
        raise ValueError(page_problem(str(exc))) from None
    with Image.open(io.BytesIO(data)) as probe:  # header only: which format to name the kept file by
        fmt = probe.format
    ext = IMAGE_FORMATS.get(fmt or "")
    if ext is None:
        raise ValueError(f"{fmt or 'this'} images are not accepted; use PNG, JPEG, WebP, BMP, TIFF or GIF")
    return {"width": image.width, "height": image.height, "ext": ext}


def _kind(data: bytes) -> str:
    if b"%PDF-" in data[:1024]:
        return "pdf"
    if data[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    return "image"


# ---------------------------------------------------------------------------------------------- the store
class UploadStore:
    """A folder of kept page files (see the module docstring)."""

    def __init__(self, root: str | Path, limits: Limits | None = None):
        self.root = Path(root)
        self.limits = limits or Limits()

    # ------------------------------------------------------------------------------------------ adding
    def add(self, name: str, data: bytes) -> AddResult:
        """Check and keep one uploaded file (a zip: each of its pages). Never raises for bad content."""
        name = display_name(name)
        if not data:
            return AddResult(rejected=[Rejected(name, "the file is empty")])
        if len(data) > self.limits.max_file_bytes:
            return AddResult(rejected=[Rejected(name, f"{_mib(len(data))} is over the "
                                                      f"{_mib(self.limits.max_file_bytes)} limit per file")])
        if _kind(data) == "zip":
            return self._add_zip(name, data)
        return self._add_one(name, data)

    def _add_one(self, name: str, data: bytes) -> AddResult:
        kind = _kind(data)
        if kind == "zip":
            return AddResult(rejected=[Rejected(name, "a zip inside a zip is not opened; upload it on its own")])
        try:
            info = _check_pdf(data, self.limits) if kind == "pdf" else _check_image(data)
        except ValueError as exc:
            reason = str(exc)
            if kind == "image" and reason == "not a readable image file":
                reason = "not a page image or a PDF (PNG, JPEG, WebP, BMP, TIFF, GIF or PDF), or a damaged one"
            return AddResult(rejected=[Rejected(name, reason)])
        digest = hashlib.sha256(data).hexdigest()[:32]
        existing = self.get(digest)
        if existing is not None:
            return AddResult(existing=[existing])
        ext = ".pdf" if kind == "pdf" else info.pop("ext")
        upload = Upload(id=digest, file=digest + ext, name=name, kind=kind, bytes=len(data), added=time.time(),
                        **info)
        self.root.mkdir(parents=True, exist_ok=True)
        _write_atomic(self.root / upload.file, data)
        _write_atomic(self.root / f"{digest}.json", json.dumps(asdict(upload)).encode("utf-8"))
        return AddResult(added=[upload])

    def _add_zip(self, name: str, data: bytes) -> AddResult:
        lim = self.limits
        try:
            zf = zipfile.ZipFile(io.BytesIO(data))
            members = zf.infolist()
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            return AddResult(rejected=[Rejected(name, f"not a readable zip ({str(exc)[:200]})")])
        out = AddResult()
        with zf:
            if len(members) > lim.max_zip_members:
                return AddResult(rejected=[Rejected(name, f"the zip holds {len(members):,} entries; at most "
                                                          f"{lim.max_zip_members:,} per zip")])
            declared = sum(m.file_size for m in members)
            if declared > lim.max_zip_bytes:
                return AddResult(rejected=[Rejected(name, f"the zip would unpack to {_mib(declared)}, over the "
                                                          f"{_mib(lim.max_zip_bytes)} limit (a zip bomb?)")])
            budget = lim.max_zip_bytes
            pages = 0
            for m in members:
                inner = m.filename.replace("\\", "/")
                base = inner.rstrip("/").rsplit("/", 1)[-1]
                if m.is_dir() or inner.startswith("__MACOSX/") or base.startswith("."):
                    continue
                label = display_name(f"{name}/{inner}")
                if m.flag_bits & 0x1:
                    out.rejected.append(Rejected(label, "password-protected (encrypted) zip entry"))
                    continue
                cap = min(lim.max_file_bytes, budget)
                if m.file_size > cap:
                    out.rejected.append(Rejected(label, f"{_mib(m.file_size)} unpacked is over the "
                                                        f"{_mib(cap)} limit"))
                    continue
                try:
                    with zf.open(m) as fh:
                        body = fh.read(cap + 1)  # never more than the limit, whatever the header says
                except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError,
                        RuntimeError) as exc:
                    out.rejected.append(Rejected(label, f"cannot unpack this entry ({str(exc)[:200]})"))
                    continue
                if len(body) > cap:
                    out.rejected.append(Rejected(label, f"unpacks to more than {_mib(cap)} (a zip bomb?)"))
                    break  # the budget is spent or the entry lies about its size: stop reading this zip
                budget -= len(body)
                pages += 1
                out.extend(self.add_member(label, body))
        if not pages and not out.rejected:
            out.rejected.append(Rejected(name, "the zip holds no files"))
        return out

    def add_member(self, label: str, body: bytes) -> AddResult:
        if not body:
            return AddResult(rejected=[Rejected(label, "the file is empty")])
        return self._add_one(label, body)

    # ------------------------------------------------------------------------------------------ reading
    def list(self) -> list[Upload]:
        """The kept uploads, oldest first (a damaged sidecar, or one whose file is gone, is left out)."""
        if not self.root.is_dir():
            return []
        out = []
        for side in self.root.glob("*.json"):
            up = self._read(side)
            if up is not None:
                out.append(up)
        return sorted(out, key=lambda u: (u.added, u.name))

    def get(self, upload_id: str) -> Upload | None:
        if not _ID.match(upload_id or ""):
            return None
        return self._read(self.root / f"{upload_id}.json")

    def _read(self, side: Path) -> Upload | None:
        if not _ID.match(side.stem):
            return None
        try:
            raw = json.loads(side.read_text(encoding="utf-8"))
            raw["page_sizes_pt"] = tuple(tuple(s) for s in raw.get("page_sizes_pt") or ())
            up = Upload(**raw)
        except (OSError, ValueError, TypeError):
            return None
        suffix = Path(up.file).suffix
        if up.id != side.stem or up.file != up.id + suffix or suffix not in (".pdf", *IMAGE_FORMATS.values()):
            return None  # a sidecar names only its own content-addressed file
        return up if (self.root / up.file).is_file() else None

    def path(self, upload: Upload) -> Path:
        return self.root / upload.file

    def remove(self, upload_id: str) -> bool:
        """Delete a kept upload (its file and sidecar); False when there is none by that id."""
        up = self.get(upload_id)
        if up is None:
            return False
        for p in (self.root / up.file, self.root / f"{up.id}.json"):
            try:
                p.unlink()
            except FileNotFoundError:
                pass
        return True

    def dataset(self, ids=None, dpi: int | None = None):
        """A measure.datasets.Dataset of the chosen uploads (all when `ids` is None), in upload order. Page names
        are the uploads' display names (made unique with the id's first digits where two share one); PDF pages
        over the pixel limit at `dpi` are marked unreadable with the reason. Raises DatasetError when none."""
        from ..runtime.image_limits import MAX_PIXELS
        from .datasets import DEFAULT_DPI, Dataset, DatasetError, Page, pdf_pixels

        dpi = dpi or DEFAULT_DPI
        chosen = [u for u in self.list() if ids is None or u.id in set(ids)]
        if not chosen:
            raise DatasetError("no uploaded pages chosen: upload page images, PDFs or a zip of them first")
        counts: dict[str, int] = {}
        for u in chosen:
            counts[u.name] = counts.get(u.name, 0) + 1
        pages = []
        root = self.root.resolve()
        for u in chosen:
            name = u.name if counts[u.name] == 1 else f"{u.name} [{u.id[:8]}]"
            path = root / u.file
            if u.kind != "pdf":
                pages.append(Page(path, name))
                continue
            for i, (w_pt, h_pt) in enumerate(u.page_sizes_pt or ((0, 0),) * u.pages):
                w, h = pdf_pixels(w_pt, h_pt, dpi)
                error = None
                if w * h > MAX_PIXELS:
                    error = f"{name} p{i + 1}: at {dpi} dpi, {pixel_limit_message(w * h, (w, h), what='PDF page')}"
                pages.append(Page(path, name, i, u.pages, error))
        return Dataset(root, root, pages, [f"{len(chosen)} uploaded file(s)"])


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
